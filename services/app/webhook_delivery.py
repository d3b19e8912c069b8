"""Webhook delivery to one endpoint: read the event stream from the endpoint's checkpoint, POST
the events it wants in signed CloudEvents batches, in stream order, one batch at a time, and move
the checkpoint past each batch once it is answered (services/domain/webhooks.py says what is sent).

- At least once: the checkpoint moves only after the endpoint answered 2xx (or refused the batch);
  a crash in between sends the batch again (receivers drop duplicates by the CloudEvent id). Past
  PASSED_MARK events in a row it does not want, it moves past them too, behind what was sent.
- In order per mail (and overall): one batch in flight per endpoint.
- Retries: no answer (timeout, connection error), 5xx, 408 and 429 are tried again after a
  doubling backoff, capped; any other status refuses the batch: counted, logged, not sent again.
- Events older than the endpoint's maximum age when they would be sent are dropped, counted and logged.
- Events the stream's retention removed before the endpoint read them (it was down or failing
  longer than the stream keeps events) are found on resuming from its checkpoint: counted (in
  stream messages) and logged as an error. A checkpoint past the stream's end (the stream deleted
  and declared again, a broker reset) starts the endpoint again at the stream's oldest event.
- Each endpoint runs on its own (its own consumer, its own task): a slow or dead endpoint delays
  no other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from services.domain import event_stream, webhooks
from services.domain.errors import OutOfRange
from services.domain.events import Event
from services.domain.webhooks import Endpoint
from services.ports.events import EventStream
from services.ports.webhooks import Checkpoints, Poster

log = logging.getLogger(__name__)

EVENTS = Counter("mailqueue_webhook_events_total", "Events handled by webhook delivery, by endpoint and outcome "
                 "(delivered; refused: the endpoint answered a 4xx other than 408/429; too_old: older than its maximum age)",
                 ["endpoint", "outcome"])
RETRIES = Counter("mailqueue_webhook_retries_total", "Webhook requests sent again (no answer, 5xx, 408 or 429)", ["endpoint"])
REPLACED = Counter("mailqueue_webhook_stream_replaced_total", "Times an endpoint's checkpoint was past the end of the "
                   "event stream (the stream deleted and declared again, a broker reset): delivery started again at "
                   "the stream's oldest event", ["endpoint"])
LOST = Counter("mailqueue_webhook_stream_messages_lost_total", "Event stream messages (each up to 1,000 events) the "
               "stream's retention removed before an endpoint read them, found on resuming from its checkpoint", ["endpoint"])


#: Events read and not wanted in a row after which an endpoint's checkpoint moves past them: a
#: narrow filter (one queue's dead letters) otherwise kept its place where its last wanted event
#: was, and a restart read again, on the loop every endpoint shares, all the stream since, and
#: counted what retention removed of it as lost.
PASSED_MARK = 1000


@dataclasses.dataclass(frozen=True)
class Passed:
    """In the inbox: the reader passed this cursor with nothing wanted since the last event put."""

    cursor: str


class EndpointDelivery:
    def __init__(self, endpoint: Endpoint, stream: EventStream, checkpoints: Checkpoints, poster: Poster, *,
                 from_oldest: bool = False, backoff_base_s: float = 0.5, backoff_cap_s: float = 60.0,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.endpoint = endpoint
        self._stream, self._checkpoints, self._poster = stream, checkpoints, poster
        self._from_oldest = from_oldest
        self._base, self._cap = backoff_base_s, backoff_cap_s
        self._clock, self._sleep = clock, sleep

    async def run(self) -> None:
        """Deliver until cancelled; raises BackendUnavailable when the stream or the checkpoint
        store fails (the caller starts it again: it resumes from the checkpoint)."""
        last, from_oldest = await self._checkpoints.load(self.endpoint.name), self._from_oldest
        if last == webhooks.OLDEST:
            last, from_oldest = None, True
        # An endpoint with no checkpoint starts at the next event recorded: its place is saved with
        # the first event read, of any type, before anything is sent, or a restart before its first
        # answer (or, with a filter, before its first wanted event) would start at "next" again and
        # skip what it had not delivered (and what came while it was down).
        placed = last is not None or from_oldest
        inbox: asyncio.Queue[Event | Passed | BaseException] = asyncio.Queue(maxsize=2 * self.endpoint.batch_size)
        reader = asyncio.create_task(self._read(last, from_oldest, inbox, placed))
        try:
            while True:
                batch = [await inbox.get()]
                while len(batch) < self.endpoint.batch_size and not inbox.empty():
                    batch.append(inbox.get_nowait())
                failed = next((x for x in batch if isinstance(x, BaseException)), None)
                read = [x for x in batch if not isinstance(x, BaseException)]  # events, and places passed
                events = [x for x in read if isinstance(x, Event)]
                if events:
                    await self._deliver(events)
                if read:
                    await self._checkpoints.save(self.endpoint.name, read[-1].cursor)
                if failed is not None:
                    raise failed
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, last: str | None, from_oldest: bool, inbox: asyncio.Queue[Event | Passed | BaseException], placed: bool) -> None:
        try:
            try:
                await self._read_from(last, from_oldest, inbox, placed)
            except OutOfRange:  # the checkpoint is of a stream since deleted and declared again
                REPLACED.labels(self.endpoint.name).inc()
                log.error("this endpoint's checkpoint is past the end of the event stream: the stream was deleted and "
                          "declared again (a broker reset) since it was saved; delivering from the oldest event the "
                          "stream holds", extra={"endpoint": self.endpoint.name, "checkpoint": last})
                # Placed at the oldest before anything is read: the old checkpoint stayed until the
                # first answer, and a restart before it (the endpoint failing) found it again, on a
                # stream grown past it by then: every event before it skipped, without a count.
                await self._checkpoints.save(self.endpoint.name, webhooks.OLDEST)
                await self._read_from(None, True, inbox, placed=True)
        except Exception as e:  # noqa: BLE001 - handed to run(), which raises it after the events before it
            await inbox.put(e)

    async def _read_from(self, last: str | None, from_oldest: bool, inbox: asyncio.Queue[Event | BaseException],
                         placed: bool) -> None:
        """The events after ``last`` (else from the oldest, else from the next), wanted ones into ``inbox``."""
        passed = 0  # events read and not wanted since the last one put in the inbox
        async with contextlib.aclosing(self._stream.watch(last, from_oldest=from_oldest)) as events:
            async for e in events:
                if not placed:  # before anything of it is sent (run saves only after what it sends)
                    before = int(e.cursor) - 1  # resuming there reads e first
                    # (the stream's very first event has no place before it: the stream's oldest)
                    await self._checkpoints.save(self.endpoint.name, str(before) if before >= 0 else webhooks.OLDEST)
                    placed = True
                if last is not None:  # the first event read: the stream kept everything after the checkpoint?
                    self._check_kept(last, e.cursor)
                    last, resumed = None, last
                    if e.cursor == resumed:  # the checkpoint's event was taken
                        continue
                if self.endpoint.wanted(e):
                    await inbox.put(e)
                    passed = 0
                else:
                    passed += 1
                    if passed >= PASSED_MARK:  # its place moves on behind what it was sent
                        await inbox.put(Passed(e.cursor))
                        passed = 0

    def _check_kept(self, checkpoint: str, first: str) -> None:
        missed = event_stream.messages_missed(checkpoint, first)
        if missed:
            LOST.labels(self.endpoint.name).inc(missed)
            log.error("the event stream's retention removed events this endpoint had not been sent: they are lost to it "
                      "(raise MAILQUEUE_EVENT_STREAM_RETENTION_S or _MAX_BYTES, or mend the endpoint sooner)", extra={
                          "endpoint": self.endpoint.name, "messages_lost": missed, "checkpoint": checkpoint, "resumed_at": first})

    async def _deliver(self, events: list[Event]) -> None:
        name, failures = self.endpoint.name, 0
        while True:
            events = self._fresh(events)
            if not events:
                return
            body = webhooks.batch_body(events)
            sent_at = int(self._clock())
            answer = await self._poster.post(name, self.endpoint.url, body, webhooks.headers(self.endpoint.secret, sent_at, body),
                                             self.endpoint.timeout_s)
            status = answer.status
            outcome = webhooks.verdict(status)
            if outcome == "delivered":
                EVENTS.labels(name, "delivered").inc(len(events))
                return
            if outcome == "refused":
                EVENTS.labels(name, "refused").inc(len(events))
                log.warning("webhook endpoint refused a batch: not sent again", extra={
                    "endpoint": name, "status": status, "events": len(events), "first_cursor": events[0].cursor})
                return
            failures += 1
            RETRIES.labels(name).inc()
            wait = webhooks.backoff_s(failures, self._base, self._cap, answer.retry_after_s)  # a 429's or 503's Retry-After honoured
            log.info("webhook endpoint failed; trying again", extra={"endpoint": name, "status": status, "failures": failures,
                                                                    "wait_s": wait})
            await self._sleep(wait)

    def _fresh(self, events: list[Event]) -> list[Event]:
        now = self._clock()
        fresh = [e for e in events if now - e.time.timestamp() <= self.endpoint.max_age_s]
        if len(fresh) < len(events):
            EVENTS.labels(self.endpoint.name, "too_old").inc(len(events) - len(fresh))
            log.warning("webhook events older than the endpoint's maximum age dropped", extra={
                "endpoint": self.endpoint.name, "dropped": len(events) - len(fresh), "max_age_s": self.endpoint.max_age_s})
        return fresh
