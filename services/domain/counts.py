"""Cheap size (#15): per-slice counters instead of reading mail rows.

For each queue and each enqueue slice, four Cassandra counters:
- ``enqueued``: +1 when a mail's row is written;
- ``gone``: +1 when a live mail is marked (dequeued, deleted, dead-lettered, expired, bounced);
- ``delayed``: +1 when a mail is published with a delay (enqueue, RETRY, hold), -1 when that
  message arrives due, or when the delay ends otherwise (Flush, delete);
- ``held``: +1 when a hold rule re-schedules a mail, -1 when it comes back or is released;
- ``bytes``: + the mail's content size with its ``enqueued``, - it with its ``gone`` (the queued
  bytes a queue's ``max_queued_bytes`` quota is checked against: services/domain/quotas.py).

size = sum(enqueued - gone), delayed, held and bytes are their sums (held is part of delayed), over the
slices from browse start: one partition read, whatever the history. Counters are approximate by
design: an update that timed out may or may not have applied and is not retried (a retry could
count twice), and a crash between a mark and its counter update loses the update. Every update is
best effort (a failure is logged and counted, never fails the operation: the mail is durable
already), and gathered in the process for ``MAILQUEUE_COUNTER_FLUSH_S`` (one update per key).
``reconcile`` rewrites them from an exact pass; ``exact = true`` on GetSize/GetQueue keeps the
scanning count.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from services.domain import model

KINDS = ("enqueued", "gone", "delayed", "held", "bytes")
#: held_by of a mail no hold rule holds any more (no null cells: a value, not an absent cell).
NOT_HELD = uuid.UUID(int=0)


def is_held(q: model.QueuedMail | model.MailState) -> bool:
    return q.held_by is not None and q.held_by != NOT_HELD


@dataclasses.dataclass(frozen=True)
class Counts:
    size: int = 0
    delayed: int = 0
    held: int = 0
    #: Start of the oldest slice with a live mail, and with a live mail that is not delayed.
    oldest_slice: dt.datetime | None = None
    oldest_ready_slice: dt.datetime | None = None
    #: Content bytes of the live mails (mails counted before this counter existed count 0).
    bytes: int = 0

    @property
    def ready(self) -> int:
        return self.size - self.delayed


def summarize(raw: dict[str, dict[dt.datetime, int]], browse_start: dt.datetime | None) -> Counts:
    """The counts of the slices from ``browse_start`` (pure; unit-tested)."""
    if browse_start is None:
        return Counts()
    slices = sorted({s for per_kind in raw.values() for s in per_kind if s >= browse_start})
    get = lambda kind, s: raw.get(kind, {}).get(s, 0)  # noqa: E731
    size = delayed = held = queued_bytes = 0
    oldest = oldest_ready = None
    for s in slices:
        live = get("enqueued", s) - get("gone", s)
        size, delayed, held = size + live, delayed + get("delayed", s), held + get("held", s)
        queued_bytes += get("bytes", s)
        if live > 0 and oldest is None:
            oldest = s
        if live - get("delayed", s) > 0 and oldest_ready is None:
            oldest_ready = s
    size = max(size, 0)
    delayed = max(min(delayed, size), 0)
    return Counts(size, delayed, max(min(held, delayed), 0), oldest, oldest_ready,
                  max(queued_bytes, 0) if size > 0 else 0)


def gone_deltas(
    raw: dict[str, dict[dt.datetime, int]], live: dict[dt.datetime, int], since: dt.datetime, before: dt.datetime | None,
) -> dict[dt.datetime, int]:
    """For each slice in [since, before) (before None: no end), what to add to its ``gone``
    counter so that enqueued - gone is the number of live mails a pass counted there (pure;
    unit-tested). Slices that agree are left out."""
    inside = lambda s: s >= since and (before is None or s < before)  # noqa: E731
    slices = {s for per_kind in raw.values() for s in per_kind if inside(s)} | {s for s in live if inside(s)}
    get = lambda kind, s: raw.get(kind, {}).get(s, 0)  # noqa: E731
    out = {}
    for s in sorted(slices):
        delta = get("enqueued", s) - get("gone", s) - live.get(s, 0)
        if delta:
            out[s] = delta
    return out


def bytes_deltas(
    raw: dict[str, dict[dt.datetime, int]], live_bytes: dict[dt.datetime, int], since: dt.datetime, before: dt.datetime | None,
) -> dict[dt.datetime, int]:
    """For each slice in [since, before) (before None: no end), what to add to its ``bytes``
    counter so that it is the size of the live mails a pass counted there (pure; unit-tested). A
    mail counted gone twice (an operator's delete and a consumer's SUCCESS of it) took its size
    off twice. Slices that agree are left out."""
    counted = raw.get("bytes", {})
    inside = lambda s: s >= since and (before is None or s < before)  # noqa: E731
    slices = {s for s in counted if inside(s)} | {s for s in live_bytes if inside(s)}
    return {s: d for s in sorted(slices) if (d := live_bytes.get(s, 0) - counted.get(s, 0))}


def exact_deltas(
    raw: dict[str, dict[dt.datetime, int]], live: list[model.QueuedMail], browse_start: dt.datetime, now: dt.datetime,
) -> list[tuple[dt.datetime, str, int]]:
    """What to add to each counter of the slices from ``browse_start`` so that they match the
    live mails (pure; unit-tested). The difference in live mails goes to ``gone``."""
    exact: dict[dt.datetime, dict[str, int]] = {}
    for q in live:
        e = exact.setdefault(q.slice_start, {"live": 0, "delayed": 0, "held": 0, "bytes": 0})
        e["live"] += 1
        e["bytes"] += q.size
        if q.due() > now:
            e["delayed"] += 1
            e["held"] += is_held(q)
    slices = {s for per_kind in raw.values() for s in per_kind if s >= browse_start} | set(exact)
    out = []
    get = lambda kind, s: raw.get(kind, {}).get(s, 0)  # noqa: E731
    for s in sorted(slices):
        e = exact.get(s, {"live": 0, "delayed": 0, "held": 0, "bytes": 0})
        counted_live = get("enqueued", s) - get("gone", s)
        for kind, delta in (("gone", counted_live - e["live"]), ("delayed", e["delayed"] - get("delayed", s)),
                            ("held", e["held"] - get("held", s)), ("bytes", e["bytes"] - get("bytes", s))):
            if delta:
                out.append((s, kind, delta))
    return out
