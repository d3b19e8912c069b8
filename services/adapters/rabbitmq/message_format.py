"""The broker message format, in one place: what a RabbitMQ message of a mail carries.

* body: the ``mailqueue.v1.QueuedMail`` protobuf (services/contract/serde.py), followed by the
  mail's content when the message carries it (small mail);
* headers: ``mailqueue-generation`` (QueuedMail.generation, when not 0), ``mailqueue-delayed``
  (1: it went through the delay ladder), ``mailqueue-content-bytes`` (the length of the content at
  the end of the body), ``mailqueue-shaped-slot`` and ``mailqueue-shaped-stamp`` (a mail waiting
  for room at its destination: the slot it reserved, in ms since the epoch, and what it was
  reserved under, services/domain/shaping.py); RabbitMQ adds ``x-delivery-count`` (quorum queues) and ``x-death``;
* properties: persistent, ``message_id`` = the enqueue id, content type and type of the body.

Publishers (services/adapters/rabbitmq/channels.py, the broker bench) build with :func:`encode`,
consumers read with :func:`decode` and hand out a :class:`RabbitMQMessage`, whose ``mail()`` decodes
the body; nothing else knows a header name or the body's format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.contract import serde
from services.domain import model
from services.ports.broker import Message

PERSISTENT = 2
CONTENT_TYPE = "application/x-protobuf"
TYPE = "mailqueue.v1.QueuedMail"
GENERATION_HEADER = "mailqueue-generation"
DELAYED_HEADER = "mailqueue-delayed"
CONTENT_HEADER = "mailqueue-content-bytes"
SLOT_HEADER = "mailqueue-shaped-slot"
STAMP_HEADER = "mailqueue-shaped-stamp"


@dataclasses.dataclass(frozen=True)
class Encoded:
    body: bytes
    headers: dict[str, int]
    #: The AMQP properties besides the headers (pika.BasicProperties and aio_pika.Message take them).
    message_id: str
    delivery_mode: int = PERSISTENT
    content_type: str = CONTENT_TYPE
    type: str = TYPE


def encode(mail: model.QueuedMail, content: bytes | None = None, delayed: bool = False,
           reservation: tuple[int, int] | None = None) -> Encoded:
    return encode_body(serde.queued_mail_to_bytes(mail), str(mail.enqueue_id), mail.generation, delayed, content, reservation)


def encode_body(body: bytes, message_id: str, generation: int = 0, delayed: bool = False,
                content: bytes | None = None, reservation: tuple[int, int] | None = None) -> Encoded:
    """A message of an already serialized QueuedMail (a publish retried reuses its bytes)."""
    headers = {GENERATION_HEADER: generation} if generation else {}
    if delayed:
        headers[DELAYED_HEADER] = 1
    if reservation is not None:
        headers[SLOT_HEADER], headers[STAMP_HEADER] = reservation
    if content is not None:
        headers[CONTENT_HEADER] = len(content)
        body += content
    return Encoded(body, headers, message_id)


@dataclasses.dataclass(frozen=True)
class Decoded:
    #: The QueuedMail bytes (decoded by ``RabbitMQMessage.mail()``), and the content if the body carries it.
    mail_bytes: bytes
    content: bytes | None
    generation: int
    delayed: bool
    delivery_count: int
    #: Why the broker dead-lettered the message last, if it did ("delivery_limit", "rejected", ...).
    death_reason: str | None
    #: (slot in ms since the epoch, stamp) of a mail that waited for room at its destination.
    reservation: tuple[int, int] | None = None


def decode(headers: Mapping[str, Any] | None, body: bytes) -> Decoded:
    """What a delivered message carries; headers of the wrong type read as absent (a message from
    elsewhere is then poison at ``RabbitMQMessage.mail()``, never a crash here)."""
    headers = headers or {}
    count, generation = headers.get("x-delivery-count", 0), headers.get(GENERATION_HEADER, 0)
    deaths = headers.get("x-death")
    death = deaths[0].get("reason") if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else None
    mail_bytes, content = split_content(body, headers.get(CONTENT_HEADER))
    slot, stamp = headers.get(SLOT_HEADER), headers.get(STAMP_HEADER)
    return Decoded(
        mail_bytes, content, generation if _int(generation) else 0, bool(headers.get(DELAYED_HEADER)),
        count if _int(count) else 0, death.decode() if isinstance(death, bytes) else death,
        (slot, stamp) if _int(slot) and _int(stamp) else None,
    )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def split_content(body: bytes, length: Any) -> tuple[bytes, bytes | None]:
    """(QueuedMail bytes, carried content or None) of a message body; a header that does not fit
    the body leaves the body whole (then it does not decode, and is dead-lettered as poison)."""
    if not _int(length) or not 0 <= length <= len(body):
        return body, None
    cut = len(body) - length
    return body[:cut], body[cut:]


@dataclasses.dataclass(frozen=True)
class RabbitMQMessage(Message):
    """A delivery of this format: the body is read when ``mail()`` is called, not on arrival."""

    def mail(self) -> model.QueuedMail:
        """The mail it carries, with its generation. Raises on an undecodable body."""
        return serde.queued_mail_from_bytes(self.body, self.generation)
