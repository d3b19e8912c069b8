"""The broker client: our pika adapter (services/adapters/rabbitmq/) vs. aio-pika, on the same messages.

    .venv/bin/pip install -c constraints.txt '.[compare]'     # aio-pika, only for this comparison
    .venv/bin/python -m bench.broker_bench [--messages 20000] [--concurrency 128] [--size 10240]

Four phases on one queue's topology (declared by the service code): confirmed persistent
publishes of the same body and headers as an Enqueue (a QueuedMail with 10 KiB of carried
content), ``--concurrency`` in flight; then consuming and acking them all, prefetch 128. CPU per
message is this process (the client library) plus RabbitMQ. Issue #17 accepts aio-pika behind the
Broker interface only if it costs the same or less CPU per message.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from typing import Any

from bench.common import CpuMeter, bench_queue, run
from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.broker import RabbitMQBroker
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.domain import model, names
from services.runtime.settings import rabbitmq_from_env

PREFETCH = 128


def mails(queue: str, n: int) -> list[model.QueuedMail]:
    now = model.utcnow()
    mail = model.Mail(name="bench", sender="a@example.com", recipients=("b@example.org",))
    return [model.QueuedMail(queue, uuid.uuid4(), now, mail, ("a" * 64,), 0, now, 0) for _ in range(n)]


async def bounded(n: int, concurrency: int, op: Any) -> float:
    """Run op(i) for i < n, ``concurrency`` at a time; the seconds it took."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await op(i)

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.monotonic() - start


async def pika_phases(settings: RabbitMQSettings, queue: str, batch: list[model.QueuedMail], content: bytes, c: int) -> list[tuple]:
    broker = RabbitMQBroker(settings)
    await broker.declare_queue(queue)
    meter = CpuMeter({})
    seconds = await bounded(len(batch), c, lambda i: broker.publish(batch[i], content=content))
    out = [("publish pika", len(batch) / seconds, meter.per_op(len(batch)))]
    consumer = await broker.consume(queue, PREFETCH)
    meter, start = CpuMeter({}), time.monotonic()
    for _ in range(len(batch)):
        m = await consumer.get()
        await consumer.ack(m.delivery_tag)
    out.append(("consume pika", len(batch) / (time.monotonic() - start), meter.per_op(len(batch))))
    await consumer.close()
    await broker.close()
    return out


async def aio_pika_phases(settings: RabbitMQSettings, queue: str, batch: list[model.QueuedMail], content: bytes, c: int) -> list[tuple]:
    import aio_pika

    declarer = RabbitMQBroker(settings)  # the topology, as the services declare it
    await declarer.declare_queue(queue)
    await declarer.close()
    connection = await aio_pika.connect(settings.url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange(names.exchange(queue), ensure=False)

    async def publish(i: int) -> None:
        q = batch[i]
        m = message_format.encode(q, content)  # the services' message, published by aio-pika
        await exchange.publish(aio_pika.Message(
            m.body, delivery_mode=aio_pika.DeliveryMode(m.delivery_mode), message_id=m.message_id,
            content_type=m.content_type, type=m.type, headers=m.headers,
        ), routing_key="", mandatory=True)

    meter = CpuMeter({})
    seconds = await bounded(len(batch), c, publish)
    out = [("publish aio-pika", len(batch) / seconds, meter.per_op(len(batch)))]
    consume_channel = await connection.channel()
    await consume_channel.set_qos(prefetch_count=PREFETCH)
    work = await consume_channel.get_queue(names.work_queue(queue), ensure=False)
    meter, start, got = CpuMeter({}), time.monotonic(), 0
    async with work.iterator() as it:
        async for message in it:
            message_format.decode(message.headers, message.body)  # as our consumer reads them
            await message.ack()
            got += 1
            if got == len(batch):
                break
    out.append(("consume aio-pika", len(batch) / (time.monotonic() - start), meter.per_op(len(batch))))
    await connection.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--size", type=int, default=10 * 1024)
    a = p.parse_args()
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        sys.exit("aio-pika is not installed: .venv/bin/pip install -c constraints.txt '.[compare]'")
    settings = rabbitmq_from_env()
    content = b"x" * a.size
    rows = []
    for label, phases in (("pika", pika_phases), ("aio-pika", aio_pika_phases)):
        queue = bench_queue(f"bench-broker-{label}")
        rows += asyncio.run(phases(settings, queue, mails(queue, a.messages), content, a.concurrency))
    print(f"\n{a.messages} messages of {a.size} B carried content, {a.concurrency} publishes in flight, prefetch {PREFETCH}")
    for name, per_s, cpu in rows:
        print(f"{name:<17} {per_s:8.1f}/s   {cpu}")


if __name__ == "__main__":
    run(main)
