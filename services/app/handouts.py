"""Hand-out events held back to be written with their answer's (docs/pages/concepts/events.md).

A consumer that answers within ``delay_s`` of the hand-out (most do, in milliseconds) has its
HANDED_OUT event written in the same history row and stream message as the answer's event
(DELIVERED, RETRY_SCHEDULED, ...): one write per mail instead of two, and nothing written before
the delivery is sent. A hand-out not answered within ``delay_s`` is written on its own, so the
history shows a mail out with its consumer about ``delay_s`` late (a failed write is tried again
each ``delay_s``); so are those still held when the stream closes, before its give-back.

What this gives up: a process killed (SIGKILL) holds no record of the hand-outs of its last
``delay_s``. Their mails come back and are handed out again, and that hand-out is recorded; the
history then shows the attempt that was answered, not the one the crash cut. ``delay_s`` 0 writes
each hand-out before it is sent, one write per hand-out batch.

Order per mail is kept within the stream: an answer whose hand-out is being written waits for
that write, and carries the event itself when that write failed (an answer that leaves while it
waits leaves the event to be written on its own, as if unanswered). (Across streams it is not: a mail
whose consumer's channel died goes to another stream at once, which may record before this one.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from services.domain.events import Event
from services.ports.events import EventLog

log = logging.getLogger(__name__)


class HandOuts:
    """One subscription's hand-out events not written yet, by delivery tag."""

    def __init__(self, events: EventLog, delay_s: float, queue: str = "") -> None:
        self._events = events
        self._delay = delay_s
        self._queue = queue
        #: Held, in the order handed out: tag -> (event, monotonic time held).
        self._held: dict[int, tuple[Event, float]] = {}
        #: Being written on their own: tag -> (event, the write).
        self._writing: dict[int, tuple[Event, asyncio.Future[None]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._flushes: set[asyncio.Task[None]] = set()

    async def handed(self, handed: Sequence[tuple[int, Event]]) -> None:
        """Hold the events of deliveries about to be sent (with ``delay_s`` 0: write them now;
        BackendUnavailable then, and the deliveries are not sent)."""
        if self._delay <= 0:
            await self._events.record([e for _, e in handed])
            return
        now = time.monotonic()
        for tag, event in handed:
            self._held[tag] = (event, now)
        self._arm()

    async def answered(self, tag: int) -> list[Event]:
        """The hand-out event of ``tag`` to record with its answer's, or none when already written."""
        held = self._held.pop(tag, None)
        if held is not None:
            return [held[0]]
        writing = self._writing.pop(tag, None)
        if writing is None:
            return []
        event, write = writing
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            if not write.cancelled():  # this caller cancelled, not the write: the event is not carried
                if not write.done():
                    self._writing[tag] = writing  # a failing write holds it again
                elif write.exception() is not None:
                    self.unanswered(tag, [event])
                raise
            return [event]
        except Exception:  # noqa: BLE001 - written with the answer instead
            return [event]
        return []

    def withdrawn(self, tags: Sequence[int]) -> None:
        """Deliveries that were never sent after all: their held events are not written."""
        for tag in tags:
            self._held.pop(tag, None)

    def unanswered(self, tag: int, handed: Sequence[Event]) -> None:
        """The answer that took ``handed`` failed before its record was written: held again, to
        be written on its own (at once when the stream is closing)."""
        if handed:
            self._held[tag] = (handed[0], time.monotonic())
            if self._closed:
                self._flush([tag])
            else:
                self._arm()

    async def close(self) -> None:
        """Write what is still held (the stream ends: those mails go back), and wait for the writes
        under way; a failure is logged, never raised (the stream's own end matters more)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            self._flush(list(self._held))
        while self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)

    # ------------------------------------------------------------------ timed writes
    def _arm(self) -> None:
        if self._timer is None and self._held and not self._closed:
            oldest = next(iter(self._held.values()))[1]
            delay = max(0.0, oldest + self._delay - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        limit = time.monotonic() - self._delay
        due = []
        for tag, (_, at) in self._held.items():
            if at > limit:
                break
            due.append(tag)
        if due:
            self._flush(due)
        self._arm()

    def _flush(self, tags: list[int]) -> None:
        """Write ``tags``' events on their own. They move from held to being written at once, in
        this step: an answer that comes before the write task runs waits for it, never records
        its own event ahead of the hand-out."""
        batch = [(tag, self._held.pop(tag)[0]) for tag in tags]
        write: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        write.add_done_callback(_retrieved)
        for tag, event in batch:
            self._writing[tag] = (event, write)
        task = asyncio.ensure_future(self._write(batch, write))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _write(self, batch: list[tuple[int, Event]], write: asyncio.Future[None]) -> None:
        try:
            await self._events.record([e for _, e in batch])
            write.set_result(None)
        except Exception as e:  # noqa: BLE001 - held again (or carried by its answer)
            write.set_exception(e)
            if self._closed:
                log.warning("hand-out events lost at the stream's end: %s", e, extra={"queue": self._queue, "events": len(batch)})
                return
            log.warning("hand-out events not written, tried again: %s", e, extra={"queue": self._queue, "events": len(batch)})
            now = time.monotonic()
            for tag, event in batch:
                if self._writing.pop(tag, None) is not None:  # not answered meanwhile
                    self._held[tag] = (event, now)
            self._arm()
        except BaseException:  # cancelled (the service stops): an answer waiting carries the event
            write.cancel()
            raise
        finally:
            for tag, _ in batch:
                self._writing.pop(tag, None)


def _retrieved(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()
