"""Queue counter updates gathered in the process and written once per key every ``flush_s``.

A Cassandra counter update costs a read on the replica; one per mail doubled Cassandra's CPU per
enqueue. Gathered, a busy queue costs a few updates a second per process. A process killed with
updates gathered loses them (at most ``flush_s`` of them): the counters drift, which they may
anyway (services/app/counters.py), and ReconcileCounters heals it. ``flush_s = 0`` writes each
update at once.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging

from prometheus_client import Counter

from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)

LOST = Counter("mailqueue_counter_updates_failed_total", "Queue counter updates lost (healed by ReconcileCounters)", ["queue"])

Key = tuple[str, str, dt.datetime]


class CounterBuffer:
    def __init__(self, dao: object, flush_s: float) -> None:
        self._dao = dao
        self._flush_s = flush_s
        self._deltas: collections.Counter[Key] = collections.Counter()
        self._scheduled = False
        self._flushing: set[asyncio.Task[None]] = set()

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None:
        """Count ``delta`` (best effort: a lost update is logged and counted, never raised)."""
        if self._flush_s <= 0:
            await self._write((queue, kind, slice_start), delta)
            return
        self._deltas[(queue, kind, slice_start)] += delta
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self._flush_s, self._start_flush)

    def _start_flush(self) -> None:
        task = asyncio.ensure_future(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def flush(self) -> None:
        """Write what is gathered now (one update per key), and wait for the writes of flushes
        already under way: once it returns, a read sees every update made before the call (an
        admin operation reads its own writes)."""
        self._scheduled = False
        deltas, self._deltas = self._deltas, collections.Counter()
        earlier = [t for t in self._flushing if t is not asyncio.current_task()]
        await asyncio.gather(*(self._write(key, d) for key, d in deltas.items() if d), *earlier)

    async def _write(self, key: Key, delta: int) -> None:
        queue, kind, slice_start = key
        try:
            await self._dao.add(queue, kind, slice_start, delta)  # type: ignore[attr-defined]
        except BackendUnavailable as e:
            LOST.labels(queue).inc()
            log.warning("queue counter update lost: %s", e, extra={"queue": queue, "kind": kind, "delta": delta})
