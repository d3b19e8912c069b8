"""Read what the services wrote, straight from the real backends."""

from __future__ import annotations

import datetime as dt

import pika

from mailqueue.v1 import enqueue_pb2, mail_pb2
from services import model, names, serde
from services.config import RabbitMQSettings
from services.slices import slices_between


def view_rows(suite, queue: str) -> list[model.QueuedMail]:
    """Every row of the queue's view, live or deleted, from browse start to now."""

    async def read() -> list[model.QueuedMail]:
        view = suite.view
        config = await view.config.current()
        start = await view.starts.browse_start(queue)
        rows = []
        for s in slices_between(start, model.utcnow() + dt.timedelta(seconds=1), config.slice_window):
            for b in range(config.bucket_count):
                rows += await view.enqueued.read_slice(queue, s, b)
        return sorted(rows, key=lambda r: r.enqueued_at)

    return suite.run(read())


def deleted_reason(suite, queue: str, enqueue_id) -> str | None:
    return suite.run(suite.view.deleted.reason(queue, enqueue_id))


def peek_messages(queue: str) -> list[model.QueuedMail]:
    """The RabbitMQ messages waiting in the queue's work queue (left in place)."""
    conn = pika.BlockingConnection(pika.URLParameters(RabbitMQSettings.from_env().url))
    try:
        ch = conn.channel()
        out = []
        while True:
            method, _props, body = ch.basic_get(names.work_queue(queue), auto_ack=False)
            if method is None:
                break
            out.append(serde.queued_mail_from_proto(mail_pb2.QueuedMail.FromString(body)))
        return out
    finally:
        conn.close()  # unacknowledged messages go back to the queue


def message_count(queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(RabbitMQSettings.from_env().url))
    try:
        return conn.channel().queue_declare(names.work_queue(queue), passive=True).method.message_count
    finally:
        conn.close()


def simple_mail(name: str = "m", sender: str = "alice@example.com", recipients=("bob@example.org",)) -> mail_pb2.Mail:
    return mail_pb2.Mail(name=name, sender=sender, recipients=list(recipients))


def inline(queue: str, mail: mail_pb2.Mail, content: bytes = b"Subject: t\r\n\r\nhello\r\n", key: str = ""):
    return enqueue_pb2.EnqueueRequest(queue=queue, mail=mail, inline_content=content, idempotency_key=key)
