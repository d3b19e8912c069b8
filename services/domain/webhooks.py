"""Webhooks: what is POSTed to an endpoint, how it is signed, and what an answer means (pure).

A request carries a batch of events as CloudEvents JSON (``application/cloudevents-batch+json``:
a JSON array of CloudEvents 1.0, structured mode), with two headers: ``Mailqueue-Timestamp`` (Unix
seconds when it was sent) and ``Mailqueue-Signature``, ``sha256=`` and the hex HMAC-SHA256, under
the endpoint's secret, of ``<timestamp>.`` followed by the body. A receiver recomputes it, compares
in constant time, and refuses a timestamp too far from its clock (a replay).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Sequence

from services.domain.event_stream import EventFilter
from services.domain.events import Event

CONTENT_TYPE = "application/cloudevents-batch+json"
SIGNATURE_HEADER = "Mailqueue-Signature"
TIMESTAMP_HEADER = "Mailqueue-Timestamp"
#: The checkpoint of an endpoint placed at the event stream's oldest event with none taken yet
#: (its first event read was the stream's very first, or the stream was declared again since its
#: last checkpoint): not a cursor, so never one of a stream's events.
OLDEST = "oldest"
#: A CloudEvent's type: this prefix and the event type ("io.mailqueue.event.delivered").
TYPE_PREFIX = "io.mailqueue.event."


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One registered endpoint: where, which events, its secret, and how long an event may wait."""

    name: str
    url: str
    secret: bytes
    wanted: EventFilter = EventFilter()
    #: An event older than this when it would be sent is dropped (counted and logged), not sent.
    max_age_s: float = 24 * 3600.0
    batch_size: int = 100
    timeout_s: float = 10.0


def cloud_event(e: Event) -> dict[str, object]:
    """The event as a CloudEvent 1.0 (structured JSON); ``id`` is the event id (receivers drop duplicates by it).
    ``subject`` is the mail's enqueue id, absent for a queue's or the install's event (CloudEvents
    allows no empty ``subject``: a strict receiver refuses the whole batch)."""
    subject = {"subject": str(e.enqueue_id)} if e.enqueue_id else {}
    return {
        "specversion": "1.0", "id": e.id, "source": f"mailqueue/{e.queue}" if e.queue else "mailqueue",
        "type": TYPE_PREFIX + e.type.value, "time": e.time.isoformat().replace("+00:00", "Z"),
        **subject, "datacontenttype": "application/json",
        "data": {"queue": e.queue, "enqueue_id": str(e.enqueue_id or ""), "name": e.name, "sender": e.sender,
                 "attempt": e.attempt, "reason": e.reason, "replica": e.replica, "traceparent": e.traceparent,
                 "details": dict(e.details), "cursor": e.cursor,
                 "actor": {"kind": e.actor.kind, "role": e.actor.role, "identity": e.actor.identity}},
    }


def batch_body(events: Sequence[Event]) -> bytes:
    return json.dumps([cloud_event(e) for e in events], separators=(",", ":")).encode()


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` under each key of ``secret`` (one per line, the newest first), joined by
    ", ": a secret rotated by adding the new key above the old one is signed with both until the
    old one is removed, so a receiver that knows either takes every batch meanwhile."""
    keys = [k.strip() for k in secret.split(b"\n") if k.strip()] or [secret]  # lines, split on \n only
    return ", ".join("sha256=" + hmac.new(k, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest() for k in keys)


def headers(secret: bytes, timestamp: int, body: bytes) -> dict[str, str]:
    return {"Content-Type": CONTENT_TYPE, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verdict(status: int | None) -> str:
    """What an answer means: "delivered" (2xx), "retry" (no answer: a timeout or a connection
    error; 5xx; 429; 408; a redirect, which is not followed: the URL needs fixing, and the events
    wait for it up to their maximum age), or "refused" (any other status: the endpoint will not
    take this batch; it is counted and not sent again)."""
    if status is None or status >= 500 or status in (408, 429) or 300 <= status < 400:
        return "retry"
    return "delivered" if 200 <= status < 300 else "refused"


def backoff_s(failures: int, base_s: float = 0.5, cap_s: float = 300.0, asked_s: float | None = None) -> float:
    """The wait before the next try after ``failures`` failed tries in a row: doubling, capped;
    at least what the endpoint asked for (``asked_s``: its Retry-After), up to MAX_RETRY_AFTER_S."""
    wait = min(cap_s, base_s * 2.0 ** min(max(0, failures - 1), 64))  # 2 ** 1024 does not fit a float: a day of failures
    return max(wait, min(asked_s, MAX_RETRY_AFTER_S)) if asked_s is not None else wait


#: The longest Retry-After honoured (an endpoint asking for more is tried again after this).
MAX_RETRY_AFTER_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Answer:
    """An endpoint's answer to a POST: its status (None: none came), and the wait its Retry-After
    asked for (seconds; None: none, or not a delay)."""

    status: int | None
    retry_after_s: float | None = None


def retry_after_s(value: str | None, now: float) -> float | None:
    """A Retry-After header's wait in seconds: delta-seconds, or an HTTP date (RFC 9110); None
    when absent or unreadable."""
    import email.utils

    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # ("²".isdigit() is True)
        return float(value)
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at is None or at.tzinfo is None:
        return None
    return max(0.0, at.timestamp() - now)
