"""Concurrent enqueues handed over as one group, so that their backend writes travel together.

One Enqueue at a time from many connections (how SMTP servers send) reaches the server spread
over time: each call's blob write, row write and publish would leave alone, one request and one
network write each, and the backends pay per request. Here a call's item runs at once when fewer
than ``running`` groups are running (a lone caller pays no wait); otherwise it waits, with every
item that arrives meanwhile, until a running group finishes, and then they run as the next group
(``GroupWrites.run_group`` in services/app/enqueue_group.py: each step for every mail in the
same event-loop turn), at most ``size`` to a group. So groups grow with the load by themselves, as the calls that arrive while the
backends answer the groups before them, like the view's group commit
(services/adapters/cassandra/group_commit.py). Each call still gets its own outcome, once its
mail is durable.

A caller that leaves (cancelled, its deadline passed) while its item waits takes it out of the
group: nothing of it is written, and its idempotency claim, if any, is released
(services/app/compensation.py). Once its group runs, the group finishes it, answered or not.

Not one primitive with the view's group commit and group read
(services/adapters/cassandra/group_commit.py, group_read.py), which gather one Cassandra request
per partition or queue at the next loop turn and never withdraw an item: a Grouper gathers whole
enqueues (blob, row and publish steps) across queues, runs a lone call at once, gives each item
its own outcome and withdraws an item whose caller left, and it runs use-case steps in app/,
which the adapters may not import.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

from services.app.compensation import Compensation
from services.app.enqueue_group import GroupWrites, Pending
from services.domain import model

GROUP = Histogram("mailqueue_enqueue_grouped_calls", "Enqueues run together as one group",
                  buckets=(1, 2, 4, 8, 16, 32, 64, 128))

#: A waiting call: its mail and its answer.
Entry = tuple[Pending, asyncio.Future[model.EnqueueResult]]


class Grouper:
    def __init__(self, writes: GroupWrites, compensation: Compensation, running: int = 1, size: int = 128) -> None:
        self._writes, self._compensation = writes, compensation
        self.running, self.size = running, size
        self._waiting: list[Entry] = []
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, item: Pending) -> model.EnqueueResult:
        """The outcome of ``item``, run in a group (its error raised as the call's own)."""
        answer: asyncio.Future[model.EnqueueResult] = asyncio.get_running_loop().create_future()
        entry = (item, answer)
        if not self._waiting and len(self._running) < self.running:  # a lone call: a group of one, at once
            self._start([entry])
        else:
            self._waiting.append(entry)
            if len(self._running) < self.running:
                self._next()
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if entry in self._waiting:  # not started: nothing of it is written; its claim is released
                self._waiting.remove(entry)
                if item.key:
                    self._compensation.undo_later(item.queue, item.key, item.enqueue_id, item.started)
            raise

    def _next(self) -> None:
        group, self._waiting = self._waiting[:self.size], self._waiting[self.size:]
        if group:
            self._start(group)

    def _start(self, group: list[Entry]) -> None:
        GROUP.observe(len(group))
        task = asyncio.ensure_future(self._run(group))
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._waiting and len(self._running) < self.running:
            self._next()

    async def _run(self, group: list[Entry]) -> None:
        items = [item for item, _ in group]
        try:
            outcomes = await self._writes.run_group(items)
        except BaseException as e:  # noqa: BLE001 - every caller of the group gets it
            outcomes = [e] * len(group)
        for (_, answer), outcome in zip(group, outcomes, strict=True):
            if answer.done():
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
                answer.add_done_callback(_retrieved)
            else:
                answer.set_result(outcome)


def _retrieved(f: asyncio.Future) -> None:
    """A caller that left does not read its answer: its error is not 'never retrieved'."""
    if not f.cancelled():
        f.exception()
