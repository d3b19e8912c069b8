"""#47.4: while RabbitMQ blocks publishers (its disk or memory alarm, raised through rabbitmqctl),
Enqueue answers UNAVAILABLE at once with the alarm named, writes nothing, and counts the refusal;
the health name ``publishing`` says NOT_SERVING while readiness stays SERVING; a consumer's
RETRY ends its stream at once instead of waiting; the first enqueue after the alarm succeeds.

An alarm blocks every publisher of the broker, other test sessions' too: these run last (marker
``outage``), keep each alarm to a few seconds and always restore the broker's limits.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2

from mailqueue.v1 import enqueue_pb2
from services.adapters.cassandra import schema
from stack.harness import health, stack, wait_until
from tests.integration.helpers import StreamConsumer, inline, message_count, simple_mail, view_rows

pytestmark = pytest.mark.outage

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

#: Each alarm: the broker's setting that raises it (and its getter), a value far beyond what the
#: machine has or uses, and the broker's words for it.
ALARMS = {
    "disk": ("rabbit_disk_monitor", "disk_free_limit", "100000000000000", "low on disk"),
    "memory": ("vm_memory_monitor", "vm_memory_high_watermark", "0.0001", "low on memory"),
}
#: An alarm lifts itself after this long even if this process dies (a timer on the broker node).
ALARM_BOUND_S = 20
#: An enqueue refused "at once": far below the 10 s confirm timeout it used to wait for.
AT_ONCE_S = 1.0


def rabbit_eval(expression: str) -> str:
    """``rabbitmqctl eval``: the expression's value, as Erlang prints it."""
    return stack("rabbitmqctl", "eval", expression).stdout.strip()


class Alarm:
    """A resource alarm raised on the broker through rabbitmqctl, lifted by ``lift`` (or by itself
    after ALARM_BOUND_S). One rabbitmqctl call each way: each takes seconds on a loaded machine."""

    def __init__(self, kind: str) -> None:
        self.module, setting, self.value, self.words = ALARMS[kind]
        self.getter, self.setter = f"get_{setting}", f"set_{setting}"
        #: The broker's own value, as an Erlang term (an integer, a fraction or {absolute, N}).
        self.saved: str | None = None

    def raise_(self) -> None:
        m = self.module
        self.saved = rabbit_eval(f"Saved = {m}:{self.getter}(), {m}:{self.setter}({self.value}), "
                                 f"timer:apply_after({ALARM_BOUND_S * 1000}, {m}, {self.setter}, [Saved]), Saved.")
        assert re.fullmatch(r"[0-9.]+|\{absolute,\d+\}", self.saved), self.saved

    def lift(self) -> None:
        if self.saved is not None:
            rabbit_eval(f"{self.module}:{self.setter}({self.saved}).")


def refused(call) -> tuple[grpc.RpcError, float]:
    """The error ``call()`` raised, and how long it took."""
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value, time.monotonic() - start


def stream(queue: str, name: str, content: bytes, key: str = ""):
    yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(
        queue=queue, mail=simple_mail(name), idempotency_key=key))
    yield enqueue_pb2.EnqueueStreamRequest(chunk=content)


def stored(s, table: str, column: str, value: str, queue: str | None = None) -> bool:
    """A row of ``table`` whose ``column`` is ``value`` (and queue_name ``queue``) exists."""
    where = f"{column} = %s" + (" AND queue_name = %s" if queue else "")
    args = (value, queue) if queue else (value,)
    return s.view.session.execute(f"SELECT {column} FROM {s.keyspace}.{table} WHERE {where}", args).one() is not None


@pytest.mark.parametrize("alarm", list(ALARMS))
def test_a_broker_alarm_makes_enqueue_refuse_at_once_writing_nothing(process_suite, alarm):
    s = process_suite
    queue = s.new_queue()
    s.enqueue_stub.Enqueue(inline(queue, simple_mail("before")), timeout=10)  # declared, and a mail to RETRY
    consumer = StreamConsumer(s.dequeue_stub, queue, prefetch=1)
    held = consumer.next()
    counted = s.metric("enqueue", "mailqueue_enqueue_refused_blocked_total", queue=queue)
    broker_alarm, tag = Alarm(alarm), uuid.uuid4().hex
    words = broker_alarm.words
    content = f"Subject: alarm {tag}\r\n\r\nbody".encode()
    keyed, streamed = f"alarm-{tag}", f"alarm-stream-{tag}"
    calls = {
        "inline": lambda: s.enqueue_stub.Enqueue(inline(queue, simple_mail("inline"), content), timeout=30),
        "inline with a key": lambda: s.enqueue_stub.Enqueue(inline(queue, simple_mail("keyed"), content, keyed), timeout=30),
        "stream": lambda: s.enqueue_stub.EnqueueStream(stream(queue, "stream", content), timeout=30),
        "stream with a key": lambda: s.enqueue_stub.EnqueueStream(stream(queue, "stream", content, streamed), timeout=30),
    }
    try:
        broker_alarm.raise_()
        raised = time.monotonic()
        # Given the alarm, known to enqueue_svc within a probe though it publishes nothing
        wait_until(lambda: health(s.enqueue.target, "publishing") == NOT_SERVING, 10, interval=0.05,
                   what=f"the {alarm} alarm on the health name publishing")
        noticed = time.monotonic() - raised
        assert health(s.enqueue.target) == SERVING  # readiness is not the alarm's (docs: errors.md)
        # When each form of Enqueue is called, Then it is refused at once, the alarm named
        took = {}
        for form, call in calls.items():
            error, took[form] = refused(call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (form, error.details())
            assert f"blocks publishers, {words}" in error.details(), (form, error.details())
            assert took[form] < AT_ONCE_S, (form, took[form])
        # And nothing was written: no row, no message, no blob, no idempotency claim
        assert [r.mail.name for r in view_rows(s, queue)] == ["before"]
        assert message_count(queue) == 0  # "before" is held by the consumer
        assert not stored(s, schema.BLOBS, "blob_id", hashlib.sha256(content).hexdigest())
        assert not any(stored(s, schema.IDEMPOTENCY, "idempotency_key", k, queue) for k in (keyed, streamed))
        assert s.metric("enqueue", "mailqueue_enqueue_refused_blocked_total", queue=queue) == counted + len(calls)
        assert s.metric("enqueue", "mailqueue_broker_blocked") == 1
        # A consumer's RETRY republishes: it fails at once too, and ends the stream
        start = time.monotonic()
        consumer.answer(held, "RETRY", "retry during the alarm")
        wait_until(lambda: consumer.error is not None, 10, interval=0.05, what="the stream to end after a RETRY")
        retry_ended = time.monotonic() - start
        assert retry_ended < 3, retry_ended  # not the 10 s confirm timeout
        assert consumer.error.code() == grpc.StatusCode.UNAVAILABLE and words in consumer.error.details()
    finally:
        broker_alarm.lift()
    lifted = time.monotonic()
    wait_until(lambda: health(s.enqueue.target, "publishing") == SERVING, 30, interval=0.05, what="the alarm lifted")
    # Then the first enqueue after the alarm succeeds, and a refused key is a first attempt
    receipt = s.enqueue_stub.Enqueue(inline(queue, simple_mail("keyed"), content, keyed), timeout=30).receipt
    resumed = time.monotonic() - lifted
    assert not receipt.duplicate
    # And the RETRYed mail was not lost: delivered again
    again = StreamConsumer(s.dequeue_stub, queue, prefetch=10)
    names = sorted(d.mail.mail.name for d in again.take(2))
    again.close()
    assert names == ["before", "keyed"]
    print(f"\n{alarm} alarm: raised for {lifted - raised:.1f} s; noticed by enqueue_svc {noticed:.2f} s after rabbitmqctl "
          "raised it; enqueue refused in "
          + ", ".join(f"{form} {t * 1000:.0f} ms" for form, t in took.items())
          + f"; a RETRY ended its stream in {retry_ended * 1000:.0f} ms; first OK enqueue {resumed:.2f} s after the lift")
