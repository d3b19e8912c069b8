"""Secure by default (#38): every backend hop is TLS, and each component's credential is refused
what it must not do, on the real Cassandra, RabbitMQ and MinIO that stack/stack.sh started (the
roles, users and policies of stack/provision.py; the grants of the schema step)."""

from __future__ import annotations

import socket
import ssl
import urllib.request
import uuid

import pika
import pytest
from cassandra import Unauthorized

from services.adapters.cassandra.session import connect
from services.adapters.rabbitmq.connection import connection_parameters
from services.adapters.s3.client import Bucket
from services.domain import names
from services.domain.errors import BackendUnavailable
from services.runtime.settings import cassandra_from_env, rabbitmq_from_env, s3_from_env
from stack.harness import credentials_dir, service_env

SERVICES = ("enqueue", "dequeue", "browse", "blob", "webhook", "sweep")


def as_role(role: str, keyspace: str) -> dict[str, str]:
    return {**service_env(keyspace), "MAILQUEUE_CREDENTIALS_DIR": credentials_dir(role)}


@pytest.fixture(scope="module")
def table(keyspace, running_stack) -> str:
    service_env(keyspace)  # the schema step (harness.prepare) ran for this keyspace
    return f"{keyspace}.{names.table('enqueued_mails')}"


# ------------------------------------------------------------------------------------ Cassandra
@pytest.mark.parametrize("role", SERVICES)
def test_a_service_role_reads_and_writes_rows_but_may_not_drop_alter_or_create(role, keyspace, table):
    cluster, session = connect(cassandra_from_env(as_role(role, keyspace)))
    try:
        session.execute(f"SELECT * FROM {table} LIMIT 1")  # SELECT: granted
        for ddl in (f"DROP TABLE {table}", f"ALTER TABLE {table} ADD extra text", f"CREATE TABLE {keyspace}.extra (k int PRIMARY KEY)",
                    f"DROP KEYSPACE {keyspace}", f"GRANT SELECT ON KEYSPACE {keyspace} TO mailqueue_{role}"):
            with pytest.raises(Unauthorized):
                session.execute(ddl)
    finally:
        cluster.shutdown()
    # The table is still there: the operator reads it.
    cluster, session = connect(cassandra_from_env(service_env(keyspace)))
    try:
        session.execute(f"SELECT * FROM {table} LIMIT 1")
    finally:
        cluster.shutdown()


def test_cassandra_refuses_a_client_without_tls_and_a_wrong_password(keyspace, table):
    settings = cassandra_from_env(as_role("enqueue", keyspace))
    import dataclasses

    with pytest.raises(BackendUnavailable):  # the native port speaks TLS only
        connect(dataclasses.replace(settings, ca_file="", request_timeout_s=3))
    with pytest.raises(BackendUnavailable, match="(?i)authentication"):
        connect(dataclasses.replace(settings, password="not-the-password"))


# ------------------------------------------------------------------------------------ RabbitMQ
def _broker_as(role: str, keyspace: str) -> pika.BlockingConnection:
    settings = rabbitmq_from_env(as_role(role, keyspace))
    return pika.BlockingConnection(connection_parameters(settings.url, settings))


def _refused(action) -> bool:  # noqa: ANN001
    try:
        action()
    except pika.exceptions.ChannelClosedByBroker as e:
        return e.reply_code == 403
    return False


def test_rabbitmq_users_may_only_do_their_work(keyspace, running_stack):
    queue = f"lp-{uuid.uuid4().hex[:8]}"
    work = names.work_queue(queue)
    with _broker_as("enqueue", keyspace) as conn:  # enqueue declares the topology...
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare(names.exchange(queue), "direct", durable=True)
        ch.queue_declare(work, durable=True)
        ch.queue_bind(work, names.exchange(queue), routing_key="")
        ch.basic_publish(names.exchange(queue), "", b"x")
        # ... and may not consume a work queue.
        assert _refused(lambda: conn.channel().basic_get(work))
    with _broker_as("dequeue", keyspace) as conn:  # dequeue consumes...
        ch = conn.channel()
        assert ch.basic_get(work, auto_ack=True)[2] == b"x"
        # ... and may not declare or delete anything.
        assert _refused(lambda: conn.channel().queue_delete(work))
        assert _refused(lambda: conn.channel().exchange_delete(names.exchange(queue)))
        assert _refused(lambda: conn.channel().queue_declare(f"mailqueue.{queue}.rogue"))
        # Outside the suite's names, nobody may do anything.
        assert _refused(lambda: conn.channel().queue_declare("not-ours"))
    stream = f"mailqueue._events.lp-{uuid.uuid4().hex[:8]}"  # an event stream (browse_svc declares them)
    with _broker_as("browse", keyspace) as conn:
        conn.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    with _broker_as("webhook", keyspace) as conn:  # webhook_svc reads the event streams...
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_cancel(ch.basic_consume(stream, lambda *_: None, arguments={"x-stream-offset": "first"}))
        # ... and nothing else: no work queue, no publish, no declare.
        assert _refused(lambda: conn.channel().basic_get(work))
        assert _refused(lambda: conn.channel().queue_declare(f"mailqueue.{queue}.rogue"))

        def publish() -> None:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish(names.exchange(queue), "", b"y")
        assert _refused(publish)
    with _broker_as("browse", keyspace) as conn:  # the admin service drops queues
        ch = conn.channel()
        ch.queue_delete(work)
        ch.queue_delete(stream)
        ch.exchange_delete(names.exchange(queue))


def test_rabbitmq_has_no_plaintext_listener_and_no_guest(keyspace, running_stack):
    settings = rabbitmq_from_env(as_role("browse", keyspace))
    host = connection_parameters(settings.url, settings).host
    with pytest.raises(OSError):
        socket.create_connection((host, 5672), timeout=2).close()
    guest = pika.URLParameters(f"amqps://guest:guest@{host}:{connection_parameters(settings.url, settings).port}/%2F")
    guest.ssl_options = connection_parameters(settings.url, settings).ssl_options
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(guest)


# ------------------------------------------------------------------------------------ S3
def test_s3_users_put_get_list_and_delete_as_their_policies_say(keyspace, running_stack):
    from minio.error import S3Error

    def bucket(role: str) -> Bucket:
        return Bucket(s3_from_env(as_role(role, keyspace)))

    key = f"blobs/lp-{uuid.uuid4().hex}"
    bucket("enqueue").put(key, b"content")
    assert bucket("dequeue").read(key, 100) == b"content"
    for role, action in (("enqueue", lambda b: b.remove(key)), ("dequeue", lambda b: b.put(key, b"other")),
                         ("dequeue", lambda b: b.remove(key)), ("browse", lambda b: b.remove(key)),
                         ("enqueue", lambda b: b.client.make_bucket(f"mq-lp-{uuid.uuid4().hex[:8]}"))):
        with pytest.raises(S3Error) as e:
            action(bucket(role))
        assert e.value.code == "AccessDenied", (role, e.value)
    assert key in [o.key for o in bucket("sweep").objects("blobs/lp-")]  # the sweep lists...
    assert bucket("sweep").head(key).size == len(b"content")  # ... reads each one's age again (spark/executors.py)...
    bucket("sweep").remove(key)  # ... and deletes
    assert key not in [o.key for o in bucket("sweep").objects("blobs/lp-")]


def test_s3_serves_tls_only(keyspace, running_stack):
    endpoint = s3_from_env(as_role("enqueue", keyspace)).endpoint
    with pytest.raises(OSError):  # plain HTTP to the TLS port: no answer it understands
        urllib.request.urlopen(f"http://{endpoint}/minio/health/live", timeout=3).read()
    context = ssl.create_default_context(cafile=s3_from_env(as_role("enqueue", keyspace)).ca_file)
    assert urllib.request.urlopen(f"https://{endpoint}/minio/health/live", timeout=3, context=context).status == 200
