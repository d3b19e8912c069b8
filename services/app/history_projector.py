"""The mail history written from the event stream (MAILQUEUE_HISTORY_FROM_STREAM=true; docs/pages/concepts/events.md).

With the setting on, a service making a change publishes its events to the stream only
(services/adapters/stream_first.py), confirmed before the change is acknowledged: the stream is
the record. One browse_svc replica at a time (a lease, ``LEASE``) reads the stream from its
checkpoint and writes each batch of events to the history as the services would have
(the same rows: one per history key and batch, and the name index), then moves the checkpoint.

- **Nothing missing.** The checkpoint moves only after a batch's rows are written; a projector
  killed in between writes that batch again when it (or another replica) resumes. An event
  written twice is read once: the history keeps an event by its id.
- **Lag.** The history follows the stream by one batch and one write (milliseconds under load);
  ``mailqueue_history_projection_lag_seconds`` is the age of the newest event written, when it
  was written. A projector down for longer than the stream's retention
  (MAILQUEUE_EVENT_STREAM_RETENTION_S) resumes at the oldest event kept: the history of the
  events older than that is lost, and the projector logs it.
- **Cost.** The delivering process writes no history row: what the history costs moves to the
  browse_svc replica holding the lease (decoding the stream, writing the rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from prometheus_client import Counter, Gauge

from services.domain import model
from services.domain.errors import BackendUnavailable
from services.ports.events import EncodedEvents, EncodedEventStream, HistoryWriter
from services.ports.view import Leases
from services.ports.webhooks import Checkpoints

log = logging.getLogger(__name__)

#: The lease held by the replica that projects (leases_v1).
LEASE = "history-projector"
#: The projector's checkpoint, among the webhook endpoints' (a name no webhook can have: a space).
CHECKPOINT = "history projector"

PROJECTED = Counter("mailqueue_history_projected_events_total", "Events written to the history from the event stream")
LAG = Gauge("mailqueue_history_projection_lag_seconds",
            "Age of the newest event the projector wrote to the history, when it wrote it")


class HistoryProjector:
    def __init__(self, stream: EncodedEventStream, history: HistoryWriter, checkpoints: Checkpoints, leases: Leases, *,
                 batch: int = 2000, lease_s: int = 15) -> None:
        self._stream, self._history, self._checkpoints, self._leases = stream, history, checkpoints, leases
        self._batch = batch
        self._lease_s = lease_s
        self.member = uuid.uuid4().hex

    async def run_forever(self) -> None:
        """Project while this replica holds the lease; ask for it again a third of its term after
        losing it or after a backend failed (the projection resumes from the checkpoint)."""
        while True:
            try:
                if await self._leases.hold(LEASE, self.member, self._lease_s):
                    await self.project()
            except BackendUnavailable as e:
                log.warning("history projection paused: %s", e)
            except Exception:  # a bug must not stop the history for the life of the process
                log.exception("history projection failed")
            await asyncio.sleep(self._lease_s / 3)

    async def project(self) -> None:
        """Write the stream's events from the checkpoint on, a batch of messages at a time, until
        the lease is lost (returns) or a backend fails (raises BackendUnavailable)."""
        cursor = await self._checkpoints.load(CHECKPOINT)
        inbox: asyncio.Queue[EncodedEvents | BaseException] = asyncio.Queue(maxsize=64)
        reader = asyncio.create_task(_read(self._stream.watch_encoded(cursor, from_oldest=cursor is None), inbox))
        renew_at = time.monotonic() + self._lease_s / 3
        resumed = cursor is None
        try:
            while True:
                batch = await _next_batch(inbox, self._batch, max(renew_at - time.monotonic(), 0))
                failed = next((x for x in batch if isinstance(x, BaseException)), None)
                messages = [x for x in batch if isinstance(x, EncodedEvents)]
                if messages and not resumed:  # the checkpoint's event comes first, unless the stream no longer holds it
                    resumed = True
                    if messages[0].first != cursor:
                        log.error("the event stream no longer holds the history projector's checkpoint (down longer than "
                                  "the stream's retention): the history lacks the events between them",
                                  extra={"checkpoint": cursor, "resumed_at": messages[0].first})
                if messages:
                    await self._write(messages)
                if failed is not None:
                    raise failed
                if time.monotonic() >= renew_at:
                    if not await self._leases.hold(LEASE, self.member, self._lease_s):
                        log.info("history projection handed over: another replica holds the lease")
                        return
                    renew_at = time.monotonic() + self._lease_s / 3
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _write(self, messages: list[EncodedEvents]) -> None:
        """The batch's rows, then the checkpoint at its last event (written again after a crash)."""
        await self._history.record_encoded([b for m in messages for b in m.events])
        await self._checkpoints.save(CHECKPOINT, messages[-1].last)
        PROJECTED.inc(sum(len(m.events) for m in messages))
        LAG.set(max((model.utcnow() - messages[-1].last_time).total_seconds(), 0.0))


async def _read(messages: AsyncIterator[EncodedEvents], inbox: asyncio.Queue[EncodedEvents | BaseException]) -> None:
    """The stream's messages into ``inbox``, then its failure (or the end of the stream as one)."""
    try:
        async for m in messages:
            await inbox.put(m)
        await inbox.put(BackendUnavailable("rabbitmq", "the event stream ended"))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - handed to the writer, which raises it after its batch
        await inbox.put(e)


async def _next_batch(inbox: asyncio.Queue[EncodedEvents | BaseException], most: int,
                      wait_s: float) -> list[EncodedEvents | BaseException]:
    """What waits in ``inbox``, up to about ``most`` events, after waiting up to ``wait_s`` for the first."""
    try:
        first = await asyncio.wait_for(inbox.get(), wait_s)
    except asyncio.TimeoutError:
        return []
    batch = [first]
    events = len(first.events) if isinstance(first, EncodedEvents) else 0
    while events < most and not inbox.empty() and not isinstance(batch[-1], BaseException):
        batch.append(m := inbox.get_nowait())
        events += len(m.events) if isinstance(m, EncodedEvents) else 0
    return batch
