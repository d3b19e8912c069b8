"""One Dequeue stream as a use-case: deliveries out while the client's answers come in.

``serving`` gives the deliveries to send (one, or up to ``max_batch`` ready at once) and, from
the moment it is entered, reads the client's answers and settles them concurrently. The
deliveries end when the client half-closes (once every answer read is settled), and raise the
first error of the answers (an invalid one: the stream fails with it). However the block is left,
the subscription is closed and gives back what it holds (services/app/closing.py).

- Once the half-close is read, nothing more is handed out: the client could not answer it.
- An answer read is carried out to its end, whatever happens to the stream afterwards (an invalid
  answer after it, a cancel, the client gone): the stream closes once it is. So every answer read
  before an invalid one is carried out, and an answer is never cut in half.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator

from services.app import actions
from services.app.delivery import Delivery, Outcome
from services.app.subscription import Subscription


@dataclasses.dataclass(frozen=True)
class Answer:
    """A client's outcome for one delivery."""

    tag: int
    outcome: Outcome
    error_message: str = ""
    retry_after: dt.timedelta | None = None


@contextlib.asynccontextmanager
async def serving(sub: Subscription, answers: AsyncIterator[list[Answer]]) -> AsyncIterator[AsyncIterator[list[Delivery]]]:
    """The stream's deliveries, while its answers are settled. Leaving the block, however (the
    client half-closed, left, or the server stops), closes the subscription."""
    settling = asyncio.create_task(_settle(sub, answers))
    next_one: list[asyncio.Task[Delivery]] = []

    async def deliveries() -> AsyncIterator[list[Delivery]]:
        while True:
            delivery = asyncio.create_task(sub.next())
            next_one[:] = [delivery]
            done, _ = await asyncio.wait({delivery, settling}, return_when=asyncio.FIRST_COMPLETED)
            if delivery in done and not settling.done():  # answers ended: nothing more (a delivery taken goes back)
                first = delivery.result()
                next_one.clear()  # its delivery is in the batch: given back from there if never sent
                batch = [first, *sub.ready(sub.max_batch - 1)] if sub.max_batch > 1 else [first]
                try:
                    await sub.record_handed_out(batch)  # recorded before it is sent
                except BaseException:
                    sub.unhand(batch)  # not sent: back unsent, no attempt spent
                    raise
                sub.sent(batch)
                yield batch
                continue
            settling.result()  # raises what settling raised; otherwise the client half-closed
            return

    try:
        yield deliveries()
    finally:
        for task in (*next_one, settling):
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            elif not task.cancelled():
                # Ended already, its error (an invalid answer, a channel that died) unread when the
                # stream ends another way (the client gone): read here, never logged as
                # "Task exception was never retrieved" (the soak counts those). A delivery it
                # handed out just before the stream ended was never sent: given back unsent.
                if task.exception() is None and task in next_one:
                    sub.unhand([task.result()])
        # Shielded: a second cancel (the client gone while the stream ends) must not cut the
        # return of what the stream holds, nor leave its consumer channel open.
        await asyncio.shield(sub.close())


async def _settle(sub: Subscription, answers: AsyncIterator[list[Answer]]) -> None:
    """Read answers until the client half-closes; settle them concurrently; raise the first error."""
    running: dict[asyncio.Future[None], asyncio.Future[None]] = {}  # the wait for each settlement -> the settlement
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def check(task: asyncio.Future[None]) -> None:
        running.pop(task, None)
        if not task.cancelled() and task.exception() is not None and not failed.done():
            sub.stop_handing_out()  # the stream fails with it: nothing more handed out
            failed.set_exception(task.exception())  # type: ignore[arg-type]

    async def read() -> None:
        try:
            async for group in answers:
                # In order, at once: each answer takes its tag and starts settling before the next one
                # of the stream is looked at (a tag answered twice is refused here); a settlement
                # begun is never cancelled (only the wait for it, shielded, is).
                for a in group:
                    settling = sub.settle(a.tag, a.outcome, a.error_message, a.retry_after)
                    waiting = asyncio.shield(settling)
                    running[waiting] = settling
                    waiting.add_done_callback(check)
        except BaseException:
            # An invalid answer (or the client gone): the stream fails with it. The answers before it
            # freed their credit at once; the deliveries that credit would let through are not
            # handed out now (no client could answer them: an attempt spent each).
            sub.stop_handing_out()
            raise
        sub.stop_handing_out()  # half-closed
        if running:
            await asyncio.wait(set(running))

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait({reader, failed}, return_when=asyncio.FIRST_COMPLETED)
        if failed.done():
            failed.result()
        reader.result()
        if failed.done():
            failed.result()
    finally:
        reader.cancel()
        # Errors nobody reads once this returns (a reader that failed after ``failed`` was set, a
        # settlement that fails later) are read by these callbacks, never logged as unretrieved.
        reader.add_done_callback(_read_error)
        failed.add_done_callback(_read_error)
        for waiting, settling in list(running.items()):  # a settlement under way goes on to its end; close waits for it
            settling.add_done_callback(actions.log_failure)  # nobody reads its end now: a failure is logged
            waiting.cancel()


def _read_error(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()
