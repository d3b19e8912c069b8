"""Slice and bucket arithmetic of the time-series view (pure functions, unit-tested).

A mail's row lives in partition (queue, slice_start, bucket):
``slice_start = floor(enqueued_at / slice_window) * slice_window`` (epoch-aligned), and the bucket
spreads one slice's writes over ``bucket_count`` partitions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _ms(value: dt.datetime | dt.timedelta) -> int:
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(milliseconds=1)
    return (value - EPOCH) // dt.timedelta(milliseconds=1)


def from_ms(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


def slice_ms(start: dt.datetime) -> int:
    """A slice start as milliseconds since the epoch (how a page token names the slice)."""
    return _ms(start)


def slice_start(instant: dt.datetime, window: dt.timedelta) -> dt.datetime:
    """The start of the slice holding ``instant``: epoch-aligned multiples of ``window``."""
    w = _ms(window)
    if w <= 0:
        raise ValueError(f"slice window must be positive, got {window}")
    return from_ms(_ms(instant) // w * w)


def slices_between(start: dt.datetime, end: dt.datetime, window: dt.timedelta) -> Iterator[dt.datetime]:
    """Every slice start from the slice of ``start`` to the slice of ``end``, both included."""
    current = slice_start(start, window)
    last = slice_start(end, window)
    while current <= last:
        yield current
        current += window


def bucket_of(name: str, enqueue_id: str, bucket_count: int) -> int:
    """A stable bucket in [0, bucket_count) for a mail.

    Deterministic from the mail (name and enqueue id), the same in every process and language:
    the first 4 bytes of SHA-1 as an unsigned big-endian integer, modulo the bucket count.
    """
    if bucket_count < 1:
        raise ValueError(f"bucket count must be >= 1, got {bucket_count}")
    digest = hashlib.sha1(f"{name}\0{enqueue_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % bucket_count


def is_divisor(candidate: dt.timedelta, of: dt.timedelta) -> bool:
    """True when ``of`` is a whole multiple of ``candidate`` (millisecond precision)."""
    c, o = _ms(candidate), _ms(of)
    return c > 0 and o % c == 0
