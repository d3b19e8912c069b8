"""How the view's DAOs (one module per table: enqueued_mails, deleted_mails, starts, queues,
retry_policies, rules, counters, idempotency) read and write values: instants, write timestamps,
unset cells."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from cassandra.query import UNSET_VALUE

log = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_UTC = dt.timezone.utc


def from_ms(ms: int | None) -> dt.datetime | None:
    """Milliseconds since the epoch (read with toUnixTimestamp: the driver's own decoding of an
    extreme timestamp can fail for the whole page) as an aware datetime."""
    return None if ms is None else _EPOCH + dt.timedelta(milliseconds=ms)


def micros(at: dt.datetime) -> int:
    """A Cassandra write timestamp (microseconds since the epoch)."""
    return (at - _EPOCH) // dt.timedelta(microseconds=1)


def utc(value: dt.datetime | None) -> dt.datetime | None:
    return value.replace(tzinfo=_UTC) if value is not None else None


def unset_if_empty(value: Any) -> Any:
    """Absent values are left unset, never written as null (a null cell is a tombstone)."""
    return value if value not in (None, "", [], {}, ()) else UNSET_VALUE
