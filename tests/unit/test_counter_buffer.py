"""The counter buffer under writes that do not end (issue 47, item 7): its flushes pile up side
by side, never as a chain, and a cancelled admin call neither walks them nor cancels them.

Pure asyncio: the DAO is a stand-in whose writes wait until released (a Cassandra that does not
answer); what is checked is the shape of what waits on what, which no backend changes.
"""

import asyncio
import datetime as dt
import time

from services.adapters.cassandra.counter_buffer import CounterBuffer
from tests.unit.aio import run

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
#: Flushes started while the writes hang: the old buffer chained them, and a cancel walked the
#: chain in 2^n steps (8 s at 22 links on this machine, RecursionError past ~490).
FLUSHES = 600


def chain_depth(tasks: set[asyncio.Task]) -> int:
    """The longest chain of futures any of ``tasks`` waits on: a task on the future it awaits, a
    gather on each of its children (walked without recursion: the chain may be long)."""
    below: dict[int, list] = {}
    stack: list = list(tasks)
    while stack:  # every future reachable, with what it waits on
        fut = stack.pop()
        if id(fut) in below:
            continue
        if isinstance(fut, asyncio.Task):
            waiter = fut._fut_waiter  # noqa: SLF001 - what the task awaits: the chain is the object of the test
            below[id(fut)] = [waiter] if waiter is not None else []
        else:
            below[id(fut)] = list(getattr(fut, "_children", None) or ())  # a gather's
        stack.extend(below[id(fut)])
    depth: dict[int, int] = {}
    for fut in tasks:  # post-order, each future once
        stack = [(fut, False)]
        while stack:
            f, expanded = stack.pop()
            if id(f) in depth:
                continue
            if expanded:
                depth[id(f)] = 1 + max((depth[id(c)] for c in below[id(f)]), default=0)
                continue
            stack.append((f, True))
            stack.extend((c, False) for c in below[id(f)] if id(c) not in depth)
    return max(depth[id(t)] for t in tasks)


class Hanging:
    """Writes that wait until ``release``; each one recorded once it ends."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.written: list[int] = []

    async def add(self, queue, kind, slice_start, delta) -> None:
        self.started += 1
        await self.release.wait()
        self.written.append(delta)


def test_flushes_of_hanging_writes_never_chain_and_a_cancelled_waiter_leaves_them_alone():
    async def scenario() -> None:
        dao = Hanging()
        buffer = CounterBuffer(dao, flush_s=60)  # the timer never fires here: each flush is started by hand
        # Given FLUSHES flushes whose writes hang (one update each, as a busy second makes)
        for _ in range(FLUSHES):
            await buffer.add("q", "gone", T0, 1)
            buffer._start_flush()  # noqa: SLF001 - what the timer does every flush_s
            await asyncio.sleep(0)  # the flush begins: a second goes by
        for _ in range(10):  # loop turns: each flush task, then its write tasks, start
            await asyncio.sleep(0)
        assert dao.started == FLUSHES
        # When an admin call waits for them (read your writes) and its deadline cancels it
        admin = asyncio.ensure_future(buffer.flush())
        for _ in range(10):
            await asyncio.sleep(0)
        deepest = chain_depth(asyncio.all_tasks())
        assert deepest <= 4, f"a chain of {deepest} futures"  # a task, its gather, a write task, its event
        began = time.perf_counter()
        admin.cancel()
        for _ in range(10):
            await asyncio.sleep(0)
        cancel_s = time.perf_counter() - began
        # Then the cancel costs nothing, and the writes were not cancelled: released, every
        # update is written.
        assert cancel_s < 0.1 and admin.cancelled()
        dao.release.set()
        await asyncio.wait_for(buffer.flush(), 5)
        assert sum(dao.written) == FLUSHES

    run(scenario())


def test_flush_waits_for_the_writes_under_way_and_its_own():
    async def scenario() -> None:
        dao = Hanging()
        buffer = CounterBuffer(dao, flush_s=60)
        await buffer.add("q", "enqueued", T0, 2)
        buffer._start_flush()  # noqa: SLF001 - a flush under way (its timer fired)
        await buffer.add("q", "enqueued", T0, 3)  # gathered, not yet flushed
        waiting = asyncio.ensure_future(buffer.flush())
        for _ in range(20):  # loop turns, no clock: the writes hang on an event only the test sets
            await asyncio.sleep(0)
        assert not waiting.done()  # both writes hang
        dao.release.set()
        await asyncio.wait_for(waiting, 5)
        assert sum(dao.written) == 5

    run(scenario())
