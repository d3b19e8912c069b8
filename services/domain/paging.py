"""Pages of Browse and BrowseDeadLetters (Google AIP-158): page size, page token, and where a
page ends (pure; unit-tested).

A listing is ordered by a position: (partition, enqueued_at, enqueue_id), the partition being
the slice start in milliseconds (Browse: every slice's buckets merged in enqueue order) or the
hour of enqueue (BrowseDeadLetters). Mails enqueued in one batch share an instant, but never an
enqueue id, so a position names one row and "after it" is exact. A page token carries the
position of the last mail of its page: the next page reads from there (a clustering range in
each partition), so it costs what it returns at any depth.

A token is opaque to clients: URL-safe base64 of a version, the listing's kind, the position,
and a digest binding it to the request that made it (queue and filters). A token that is not
one of ours, or that comes back with another queue or other filters, is INVALID_ARGUMENT.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import functools
import hashlib
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from services.domain.errors import InvalidArgument

#: The largest page_size a client may ask for (more: INVALID_ARGUMENT). 0 asks for no page limit.
MAX_PAGE_SIZE = 1000
#: The listings a token can belong to.
MAILS = b"m"
DEAD_LETTERS = b"d"

_VERSION = 1
_BODY = struct.Struct(">Bcqq16s")  # version, kind, partition, enqueued_at (ms), enqueue_id
_DIGEST = 8
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: The last millisecond of year 9999: the latest position a datetime can hold.
_LAST_MS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.timezone.utc) - _EPOCH) // dt.timedelta(milliseconds=1)

T = TypeVar("T")


def id_order(enqueue_id: uuid.UUID | bytes) -> tuple[int, bytes]:
    """Where a uuid sorts among others as Cassandra sorts a uuid column: by its version first, then
    by its bytes (unsigned). Enqueue ids are version 4; a moved or redriven mail's are version 5
    (services/app/moves.py ``landing_id``), so bytes alone would order the two kinds otherwise, and
    a page boundary between them would skip or repeat a mail."""
    b = enqueue_id if isinstance(enqueue_id, bytes) else enqueue_id.bytes
    return b[6] >> 4, b


@functools.total_ordering
@dataclasses.dataclass(frozen=True)
class Position:
    """Where a row sorts in its listing; positions compare in listing order."""

    partition: int
    enqueued_at: dt.datetime
    #: The enqueue id's bytes (compared as ``id_order`` says).
    enqueue_id: bytes

    @classmethod
    def of(cls, partition: int, enqueued_at: dt.datetime, enqueue_id: uuid.UUID) -> Position:
        return cls(partition, enqueued_at, enqueue_id.bytes)

    @property
    def id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.enqueue_id)

    def _key(self) -> tuple[int, dt.datetime, tuple[int, bytes]]:
        return self.partition, self.enqueued_at, id_order(self.enqueue_id)

    def __lt__(self, other: Position) -> bool:
        return self._key() < other._key()


@dataclasses.dataclass(frozen=True)
class PageRequest:
    """A listing's page: at most ``size`` rows (0: no limit), after ``after`` (None: from the start)."""

    size: int = 0
    after: Position | None = None


def page_size(size: int) -> int:
    """A valid page size (0: no page limit); INVALID_ARGUMENT otherwise."""
    if size < 0 or size > MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size must be 0 (no page limit) to {MAX_PAGE_SIZE}, got {size}")
    return size


def request_key(queue: str, *conditions: Any) -> bytes:
    """What a token is bound to: the queue and the listing's conditions (dataclasses: their
    fields, but the call's ``now``). page_size and include_content are not part of it."""
    parts: list[Any] = [queue]
    for c in conditions:
        if dataclasses.is_dataclass(c) and not isinstance(c, type):
            parts.append(sorted((f.name, _canonical(getattr(c, f.name))) for f in dataclasses.fields(c) if f.name != "now"))
        else:
            parts.append(_canonical(c))
    return repr(parts).encode()


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sorted((f.name, _canonical(getattr(value, f.name))) for f in dataclasses.fields(value) if f.name != "now")
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return value


def _digest(body: bytes, key: bytes) -> bytes:
    return hashlib.sha256(body + b"\0" + key).digest()[:_DIGEST]


def encode(kind: bytes, key: bytes, p: Position) -> str:
    """The token that resumes a ``kind`` listing of the request ``key`` right after ``p``."""
    ms = (p.enqueued_at - _EPOCH) // dt.timedelta(milliseconds=1)
    body = _BODY.pack(_VERSION, kind, p.partition, ms, p.enqueue_id)
    return base64.urlsafe_b64encode(body + _digest(body, key)).decode().rstrip("=")


def decode(kind: bytes, key: bytes, token: str) -> Position:
    """The position a token resumes after; INVALID_ARGUMENT when it is not a token of this
    listing and request."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _BODY.size + _DIGEST:
        raise InvalidArgument("page_token is not a token this listing returned: pass next_page_token as it came, "
                              "or leave page_token empty for the first page")
    body, digest = raw[:_BODY.size], raw[_BODY.size:]
    version, got_kind, partition, ms, enqueue_id = _BODY.unpack(body)
    if version != _VERSION or got_kind != kind or digest != _digest(body, key):
        raise InvalidArgument("page_token does not belong to this request: the queue and every filter must be those "
                              "of the call that returned it (only page_size may change)")
    # The digest catches a damaged token, not a made one (it has no secret): a position no listing
    # returns (before 1970, after 9999) is refused here, not left to overflow further on.
    if not (0 <= partition <= _LAST_MS and 0 <= ms <= _LAST_MS):
        raise InvalidArgument("page_token holds a position no listing returns: pass next_page_token as it came")
    return Position(partition, _EPOCH + dt.timedelta(milliseconds=ms), enqueue_id)


def request(size: int, token: str, limit: int, kind: bytes, key: bytes) -> PageRequest:
    """The page a request asks for; INVALID_ARGUMENT for a bad size or token, or a ``limit``
    given with either (a page has its size: ``limit`` is for unpaged listings)."""
    if limit and (size or token):
        raise InvalidArgument("limit does not combine with page_size or page_token: page with page_size alone")
    return PageRequest(page_size(size), decode(kind, key, token) if token else None)


async def paged(
    items: AsyncIterator[T], size: int, token: Callable[[T], str],
) -> AsyncIterator[tuple[T, str]]:
    """``items`` as (item, next_page_token): at most ``size`` of them (0: all), the token empty
    but on the last item of a full page that another item follows (``token(item)``). So an
    empty token on the last item means the listing has no more; a page never ends with a token
    that leads to an empty page. To know, one item past the page is read (and not handed out)."""
    held: T | None = None
    count = 0
    async with aclosing(items):  # type: ignore[type-var]
        async for item in items:
            if held is not None:
                if size and count == size:
                    yield held, token(held)
                    return
                yield held, ""
            held, count = item, count + 1
    if held is not None:
        yield held, ""
