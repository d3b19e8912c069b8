"""Grouped point reads: reads of one queue's per-mail rows that meet in time go as one IN query.

Not the same primitive as group_commit.py, though both send what one key gathers by the next
loop turn: a read changes nothing, so all that waits leaves at once with no bound in flight, its
keys deduplicated into one IN query whose rows go back each to its own caller, where a write batch
keeps at most ``IN_FLIGHT`` per partition and gives one outcome to all; nor services/app/
enqueue_group.py's Grouper (see there).

Dequeue reads every delivered mail's deleted mark (``deleted_mails``); RabbitMQ hands a consumer
its prefetch in bursts, and browse checks a slice's marks 64 at a time. Each request costs the
driver ~0.1 ms of CPU in the service, so reads that arrive in the same event-loop turn leave
together: ``WHERE queue_name = ? AND enqueue_id IN ?``, up to ``MAX_KEYS`` keys per request.
Without load a read leaves alone at the next loop turn. Every caller gets its own row (or None),
or the request's error.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Histogram

MAX_KEYS = 64

KEYS_PER_READ = Histogram(
    "mailqueue_view_group_read_keys", "Keys per grouped point read of deleted_mails", buckets=(1, 2, 4, 8, 16, 32, 64),
)

#: Reads the rows of these enqueue ids of a queue; returns {enqueue_id: row} for those that exist.
Fetch = Callable[[str, list[uuid.UUID]], Awaitable[dict[uuid.UUID, Any]]]


class GroupRead:
    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._waiting: dict[str, list[tuple[uuid.UUID, asyncio.Future[Any]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, queue: str, enqueue_id: uuid.UUID) -> Any:
        """The row of ``enqueue_id`` in ``queue``, or None when there is none."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        done.add_done_callback(_retrieved)  # a cancelled caller's error is not "never retrieved"
        waiting = self._waiting.setdefault(queue, [])
        if not waiting:
            loop.call_soon(self._send, queue)
        waiting.append((enqueue_id, done))
        return await asyncio.shield(done)  # a cancelled caller does not cancel the others' read

    def _send(self, queue: str) -> None:
        waiting = self._waiting.pop(queue, [])
        for i in range(0, len(waiting), MAX_KEYS):
            task = asyncio.get_running_loop().create_task(self._read(queue, waiting[i:i + MAX_KEYS]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, queue: str, group: list[tuple[uuid.UUID, asyncio.Future[Any]]]) -> None:
        KEYS_PER_READ.observe(len(group))
        try:
            rows = await self._fetch(queue, list(dict.fromkeys(key for key, _ in group)))
        except BaseException as e:  # noqa: BLE001 - every caller gets the read's error
            for _, done in group:
                if not done.done():
                    done.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for key, done in group:
            if not done.done():
                done.set_result(rows.get(key))


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
