"""Queue counter updates gathered in the process and written once per key every ``flush_s``.

A Cassandra counter update costs a read on the replica; one per mail doubled Cassandra's CPU per
enqueue. Gathered, a busy queue costs a few updates a second per process. A process killed with
updates gathered loses them (at most ``flush_s`` of them): the counters drift, which they may
anyway (services/domain/counts.py), and ReconcileCounters heals it. ``flush_s = 0`` writes each
update at once.

Each flush is one task that writes its own updates and waits for nothing else, and a caller that
waits for the writes (``flush``) waits with ``asyncio.wait``, which never cancels what it waits
for. So the writes under way never form a chain, however many there are: a flush that waited for
the earlier flushes with ``gather`` built one link per ``flush_s`` while a write hung, and a
cancelled admin call then walked that chain (exponentially: a minute of blocked event loop at 26
links, RecursionError at ~490; issue 47). And a caller's cancel never cancels a write.
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
        self._timer: asyncio.TimerHandle | None = None
        #: The flushes being written.
        self._writing: set[asyncio.Task[None]] = set()

    async def add(self, queue: str, kind: str, slice_start: dt.datetime, delta: int) -> None:
        """Count ``delta`` (best effort: a lost update is logged and counted, never raised)."""
        if self._flush_s <= 0:
            await self._write((queue, kind, slice_start), delta)
            return
        self._deltas[(queue, kind, slice_start)] += delta
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._start_flush)

    def _start_flush(self) -> None:
        """Start writing what is gathered now, in a task of its own (none when nothing is)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deltas, self._deltas = self._deltas, collections.Counter()
        writes = [(key, d) for key, d in deltas.items() if d]
        if not writes:
            return
        task = asyncio.ensure_future(self._write_all(writes))
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _write_all(self, writes: list[tuple[Key, int]]) -> None:
        await asyncio.gather(*(self._write(key, d) for key, d in writes))

    async def flush(self) -> None:
        """Write what is gathered now, and wait until it and the flushes already under way are
        written: once it returns, a read sees every update made before the call (an admin
        operation reads its own writes). A cancelled caller stops waiting; the writes go on."""
        self._start_flush()
        if self._writing:
            await asyncio.wait(set(self._writing))

    async def _write(self, key: Key, delta: int) -> None:
        queue, kind, slice_start = key
        try:
            await self._dao.add(queue, kind, slice_start, delta)  # type: ignore[attr-defined]
        except BackendUnavailable as e:
            LOST.labels(queue).inc()
            log.warning("queue counter update lost: %s", e, extra={"queue": queue, "kind": kind, "delta": delta})
        except Exception:  # a defect: logged with its traceback here, not "never retrieved" in a task
            LOST.labels(queue).inc()
            log.exception("queue counter update lost", extra={"queue": queue, "kind": kind, "delta": delta})
