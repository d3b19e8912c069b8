"""One real round trip per backend, with the same clients the services use (issue: foundation)."""

import hashlib
import io
import os
import uuid

import pika
from cassandra.cluster import Cluster
from minio import Minio

from services.config import CassandraSettings, RabbitMQSettings, S3Settings


def test_cql_write_then_read(running_stack):
    s = CassandraSettings.from_env()
    cluster = Cluster(list(s.hosts), port=s.port, protocol_version=5)
    session = cluster.connect()
    try:
        session.execute(
            "CREATE KEYSPACE IF NOT EXISTS mq_smoke WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"
        )
        session.execute("CREATE TABLE IF NOT EXISTS mq_smoke.kv (k text PRIMARY KEY, v text)")
        key, value = uuid.uuid4().hex, uuid.uuid4().hex
        session.execute("INSERT INTO mq_smoke.kv (k, v) VALUES (%s, %s)", (key, value))
        assert session.execute("SELECT v FROM mq_smoke.kv WHERE k = %s", (key,)).one().v == value
        assert session.execute("SELECT release_version FROM system.local").one().release_version.startswith("5.0")
    finally:
        cluster.shutdown()


def test_amqp_publish_with_confirm_then_consume(running_stack):
    conn = pika.BlockingConnection(pika.URLParameters(RabbitMQSettings.from_env().url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = f"smoke-{uuid.uuid4().hex}"
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        body = os.urandom(64)
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)  # raises unless confirmed
        method, _props, got = ch.basic_get(queue, auto_ack=False)
        assert got == body and method is not None
        ch.basic_ack(method.delivery_tag)
        ch.queue_delete(queue)
    finally:
        conn.close()


def test_s3_put_then_get(running_stack):
    s = S3Settings.from_env()
    client = Minio(s.endpoint, access_key=s.access_key, secret_key=s.secret_key, secure=False)
    bucket = "mq-smoke"
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    data = os.urandom(100_000)
    key = hashlib.sha256(data).hexdigest()
    client.put_object(bucket, key, io.BytesIO(data), len(data))
    response = client.get_object(bucket, key)
    try:
        assert response.read() == data
    finally:
        response.close()
        response.release_conn()
    client.remove_object(bucket, key)
