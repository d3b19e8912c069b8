"""What RabbitMQ spends per event-stream message: a stream queue against a classic one, by size.

    .venv/bin/python -m bench.stream_bench [--messages 2000] [--rounds 2]

Raw pika (a blocking connection, publisher confirms, one message in flight: how the event stream
publishes, services/adapters/rabbitmq/event_stream.py), as the operator. The body is the message
the stream gets from a bench-shaped dequeue: an EventBatch of 46 events (23 mails handed out and
delivered), about 11 KB; then the same body compressed with zlib (level 1), and a 300-byte body.
Each line is RabbitMQ's CPU per message (``/proc`` of the stack's broker) and the rate. Answers:
is the broker's cost per event-stream message per message or per byte, and would compressing the
batches pay.
"""

from __future__ import annotations

import argparse
import time
import uuid
import zlib

import pika

from bench.common import cpu_seconds, run, stack_pids
from services.adapters.rabbitmq.connection import connection_parameters
from services.contract import events_serde
from services.domain import events, model
from services.runtime.settings import rabbitmq_from_env


def delivery_batch(mails: int = 23) -> bytes:
    """The EventBatch of ``mails`` delivered mails: a hand-out and a delivery each, as dequeue_svc writes them."""
    now = model.utcnow()
    actor = events.Actor("caller", "consumer", "token:1606b37d10cd")
    out = []
    for i in range(mails):
        mail_id = uuid.uuid4()
        for kind in (events.EventType.HANDED_OUT, events.EventType.DELIVERED):
            out.append(events.Event(
                id=events.event_id(kind, "bench-q", mail_id, 1), time=now, type=kind, queue="bench-q-1234", enqueue_id=mail_id,
                actor=actor, name=f"mail-{i}", sender="sender@example.com", attempt=1, replica="dequeue-7f9c-abcde",
                traceparent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"))
    return events_serde.batch_of_encoded(events_serde.encode_each(out))


def per_call_us(fn, n: int = 1000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    body = delivery_batch()
    packed = zlib.compress(body, 1)
    print(f"an EventBatch of 46 events: {len(body)} B; zlib level 1: {len(packed)} B "
          f"({per_call_us(lambda: zlib.compress(body, 1)):.0f} us to compress, "
          f"{per_call_us(lambda: zlib.decompress(packed)):.0f} us to decompress)")
    settings = rabbitmq_from_env()
    conn = pika.BlockingConnection(connection_parameters(settings.urls[0], settings))
    channel = conn.channel()
    channel.confirm_delivery()
    tag = uuid.uuid4().hex[:8]
    stream, classic = f"bench.stream.{tag}", f"bench.classic.{tag}"
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream", "x-max-age": "600s"})
    channel.queue_declare(classic, durable=True, arguments={"x-queue-type": "classic"})
    broker = stack_pids()["rabbitmq"]
    properties = pika.BasicProperties(delivery_mode=2, type="mailqueue.v1.EventBatch")
    try:
        for r in range(a.rounds):
            for label, queue, payload in (("stream", stream, body), ("stream, zlib", stream, packed), ("stream", stream, body[:300]),
                                          ("classic", classic, body), ("classic, zlib", classic, packed)):
                cpu, start = cpu_seconds(broker), time.perf_counter()
                for _ in range(a.messages):
                    channel.basic_publish("", queue, payload, properties)
                seconds = time.perf_counter() - start
                print(f"round {r + 1} {label:13s} {len(payload):6d} B: RabbitMQ {1000 * (cpu_seconds(broker) - cpu) / a.messages:.2f} ms "
                      f"CPU per message, {a.messages / seconds:.0f} messages/s")
            channel.queue_purge(classic)
    finally:
        channel.queue_delete(stream)
        channel.queue_delete(classic)
        conn.close()


if __name__ == "__main__":
    run(main)
