"""Group commit: writes to one partition that meet in time go to Cassandra as one batch.

Not the same primitive as group_read.py, though both send what one key gathers by the next loop
turn: a write batch is one atomic request with one outcome for all its callers and at most
``IN_FLIGHT`` per partition (the rest waits for one to finish), where a read sends all that waits
at once with no bound and hands each caller its own row; nor services/app/enqueue_group.py's Grouper
(see there).

Under load, many enqueues write a row into the same (queue, slice, bucket) partition at about
the same moment. Each request costs the driver ~0.1 ms of CPU in the service and Cassandra a
mutation of its own; a single-partition UNLOGGED batch is one request and one mutation, applied
atomically (Cassandra checks batch sizes only for batches that span partitions).

Per partition, at most ``IN_FLIGHT`` batches are outstanding; writes that arrive meanwhile wait
and leave together with the next batch (up to ``MAX_STATEMENTS``).

The key need not be one Cassandra partition: the deleted marks (one partition per mail) are
grouped by queue, at most ``CROSS_PARTITION_STATEMENTS`` per batch (Cassandra warns past 10
partitions in an unlogged batch) and more in flight. Such a batch is one request instead of one
per mail (the driver's CPU per request in the service, the coordinator's per request), not
atomic: a failed batch may have applied some of its writes, as a timed-out single write may
have; every caller gets the error and treats it as not written. Without load a write leaves
at the next event-loop turn, alone, so latency only grows when batching pays for it. Every
caller gets its batch's outcome: success, or the batch's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType
from prometheus_client import Histogram

from services.adapters.cassandra.session import execute
from services.adapters.cassandra.statement_kinds import batch_kind

MAX_STATEMENTS = 64
IN_FLIGHT = 2
#: A batch's statements, and the batches in flight per key, when a key spans partitions.
CROSS_PARTITION_STATEMENTS = 8
CROSS_PARTITION_IN_FLIGHT = 4

BATCH_SIZE = Histogram(
    "mailqueue_view_group_commit_statements", "Statements per group-committed Cassandra request",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)

_Write = tuple[Any, Any, "asyncio.Future[None]"]


class GroupCommit:
    def __init__(self, session: Session, max_statements: int = MAX_STATEMENTS, in_flight: int = IN_FLIGHT) -> None:
        self._session = session
        self._max_statements = max_statements
        self._max_in_flight = in_flight
        self._waiting: dict[Hashable, list[_Write]] = {}
        self._in_flight: dict[Hashable, int] = {}
        self._scheduled: set[Hashable] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def execute(self, partition: Hashable, statement: Any, params: Any) -> None:
        """Run ``statement`` with ``params`` (a write to ``partition``), maybe with others."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.add_done_callback(_retrieved)  # a cancelled caller's error is not "never retrieved"
        self._waiting.setdefault(partition, []).append((statement, params, done))
        if partition not in self._scheduled:
            self._scheduled.add(partition)
            loop.call_soon(self._send, partition)
        await asyncio.shield(done)  # a cancelled caller does not cancel the others' batch

    def _send(self, partition: Hashable) -> None:
        self._scheduled.discard(partition)
        waiting = self._waiting.get(partition)
        while waiting and self._in_flight.get(partition, 0) < self._max_in_flight:
            group, rest = waiting[:self._max_statements], waiting[self._max_statements:]
            if rest:
                self._waiting[partition] = waiting = rest
            else:
                del self._waiting[partition]
                waiting = None
            self._in_flight[partition] = self._in_flight.get(partition, 0) + 1
            task = asyncio.get_running_loop().create_task(self._write(partition, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, partition: Hashable, group: list[_Write]) -> None:
        try:
            BATCH_SIZE.observe(len(group))
            kind = None
            if len(group) == 1:
                statement, params, _ = group[0]
                request: Any = statement.bind(params)
            else:
                kind = batch_kind(group[0][0])
                request = BatchStatement(batch_type=BatchType.UNLOGGED)
                for statement, params, _ in group:
                    request.add(statement, params)
            try:
                await execute(self._session, request, kind=kind)
            except BaseException as e:  # noqa: BLE001 - every caller gets the batch's error
                for _, _, done in group:
                    if not done.done():
                        done.set_exception(e)
                if not isinstance(e, Exception):
                    raise
            else:
                for _, _, done in group:
                    if not done.done():
                        done.set_result(None)
        finally:
            left = self._in_flight[partition] - 1
            if left:
                self._in_flight[partition] = left
            else:
                del self._in_flight[partition]
            if partition in self._waiting:
                self._send(partition)


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()
