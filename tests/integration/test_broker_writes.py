"""The frames pika emits in one event-loop turn reach the RabbitMQ socket as one write
(services/adapters/rabbitmq/connection.py ``CoalescingConnection``): a group's publishes, each
three frames (method, header, body), leave together instead of a TLS record and a system call
each. Counted on the real broker over TLS, never timed; and every message arrives, in order.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from services.domain import model
from stack.harness import as_service, new_keyspace, wait_until
from tests.integration.helpers import message_count

MAILS = 40


def queued(queue: str, i: int) -> model.QueuedMail:
    now = model.utcnow()
    mail = model.Mail(name=f"m{i}", sender="a@example.com", recipients=("b@example.org",))
    return model.QueuedMail(queue, uuid.uuid4(), now, mail, (f"{i:064x}",), 10, now, 0)


def test_a_group_of_publishes_leaves_in_one_write(aio_loop, running_stack):
    from services.adapters.rabbitmq.broker import RabbitMQBroker
    from services.runtime.settings import rabbitmq_from_env

    queue = f"writes-{uuid.uuid4().hex[:8]}"
    broker = RabbitMQBroker(rabbitmq_from_env(as_service("browse", dict(os.environ))), new_keyspace())

    async def run() -> tuple[int, int]:
        await broker.declare_queue(queue)
        await broker.publish(queued(queue, -1))  # the confirm channel open, the connection warm
        conn = await broker._conn.connection()
        transport, writes = conn._transport, []
        write = transport.write
        transport.write = lambda data: (writes.append(len(data)), write(data))[1]  # what reaches the socket's buffer
        frames = conn.frames_sent
        try:
            await asyncio.gather(*(broker.publish(queued(queue, i)) for i in range(MAILS)))  # as a group does
        finally:
            del transport.write
        return len(writes), conn.frames_sent - frames

    try:
        writes, frames = aio_loop.run(run())
        wait_until(lambda: message_count(queue) == MAILS + 1, 30, what=f"the {MAILS + 1} messages in {queue}")
    finally:
        aio_loop.run(broker.delete_queue(queue))
        aio_loop.run(broker.close())
    assert frames >= 3 * MAILS, frames  # method, header and body each
    # One write for the publishes' frames; the rest are the confirms' turns (none is a frame apart).
    assert writes <= 3, (writes, frames)
