"""Every broker and storage name, made by small pure functions in one place.

Exchange, queue, dead-letter and table names must never drift between services.
"""

from __future__ import annotations

#: Prefix of every RabbitMQ object this suite declares.
AMQP_PREFIX = "mailqueue"

#: Version suffix of the Cassandra tables; a new layout gets a new suffix, never an in-place change.
TABLE_VERSION = "v1"


def exchange(queue: str) -> str:
    """The direct exchange that enqueue publishes a queue's mails to."""
    return f"{AMQP_PREFIX}.{queue}"


def work_queue(queue: str, priority: str = "normal") -> str:
    """The RabbitMQ queue that dequeue consumes for one delivery class (normal: the original name)."""
    return f"{AMQP_PREFIX}.{queue}.work" + ("" if priority == "normal" else f".{priority}")


def priority_key(priority: str) -> str:
    """The routing key of a class on the queue's direct exchange (normal: "")."""
    return "" if priority == "normal" else priority


def dead_letter_exchange(queue: str) -> str:
    """Where rejected and poison messages of a queue are routed."""
    return f"{AMQP_PREFIX}.{queue}.dead-letter"


def dead_letter_queue(queue: str) -> str:
    """The queue that keeps a queue's dead letters for operators."""
    return f"{AMQP_PREFIX}.{queue}.dead-letter"


def dead_letter_queue_name(queue: str) -> str:
    """The mail queue whose exchange would be ``queue``'s dead-letter exchange."""
    return f"{queue}.dead-letter"


def delay_exchange(level: int) -> str:
    """Level ``level`` of the delay ladder (a topic exchange shared by every queue)."""
    return f"{AMQP_PREFIX}.delay.{level}"


def delay_queue(level: int) -> str:
    """The wait queue of ladder level ``level``: its messages wait 2**level delay units."""
    return f"{AMQP_PREFIX}.delay.{level}"


def delay_delivery_exchange() -> str:
    """Where the ladder hands due messages to their work queues (topic, by queue name)."""
    return f"{AMQP_PREFIX}.delay.deliver"


def delay_unroutable() -> str:
    """The delivery exchange's alternate exchange and its queue: a delayed message whose work queue
    no longer exists ends there (kept 7 days) instead of being retried by its wait queue forever."""
    return f"{AMQP_PREFIX}.delay.unroutable"


def alarm_probe_exchange() -> str:
    """A fanout exchange bound to nothing: enqueue_svc publishes an empty message to it every
    second, so that RabbitMQ tells it at once when a resource alarm blocks publishers
    (services/adapters/rabbitmq/alarms.py). What it receives is dropped."""
    return f"{AMQP_PREFIX}.alarm-probe"


def dead_letter_marks_queue(keyspace: str) -> str:
    """Bound to the dead-letter exchange of every queue of the view in ``keyspace``: dequeue_svc
    marks in that view every mail that reaches it unmarked (the broker dead-lettered it on its own).
    One per keyspace, so suites that share a broker never mark each other's mails."""
    return f"{AMQP_PREFIX}.dead-letter-marks.{keyspace}"


def table(name: str) -> str:
    """A versioned Cassandra table name: ``table("enqueued_mails") == "enqueued_mails_v1"``."""
    return f"{name}_{TABLE_VERSION}"


def blob_key(blob_id: str) -> str:
    """The S3 object key of a content-addressed blob."""
    return f"blobs/{blob_id}"


def event_stream(keyspace: str) -> str:
    """The event stream of the view in ``keyspace`` (a RabbitMQ stream queue) and the fanout
    exchange that feeds it. One per keyspace, like the dead-letter marks queue. The "_" keeps it
    apart from every mail queue's exchange (``exchange(queue)``: a queue name starts with a letter or digit)."""
    return f"{AMQP_PREFIX}._events.{keyspace}"
