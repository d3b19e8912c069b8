"""Finishing an enqueue's idempotency claim, eventually: undoing a failed enqueue (DESIGN §4), or
committing the key of one that succeeded.

An enqueue that fails after its view row may have been written (a timeout can land the write)
is undone: the mail is marked deleted (with its counters, if they were bumped), so a message it
may have published is skipped and nothing half-enqueued is browsed or delivered; **then** its
idempotency claim is released. In that order: while the mark has not landed, the claim stays, so
a retry with the key takes over this enqueue id (one mail, whatever was written) and never makes
a second mail beside a live one (services/app/key_claims.py).

An undo that fails too (the outage that failed the enqueue, a quorum lost with a write already on
one replica) is retried in the background until it lands, so the half-written row never
surfaces once the backend is back; the caller's answer is not delayed by that outage. Blobs are
content-addressed and shared, so a failed enqueue leaves its blob for the retention sweep.

A commit the backend does not answer is retried the same way, and the mail acknowledged: written
and published, it is enqueued whatever the key's row says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Awaitable, Callable

from prometheus_client import Gauge

from services.app.key_claims import KeyClaims, undo_time
from services.app.retry import retrying
from services.domain import model, validation
from services.domain.backoff import Backoff
from services.domain.errors import Aborted, BackendUnavailable
from services.ports.view import View

log = logging.getLogger(__name__)

COMPENSATIONS_PENDING = Gauge(
    "mailqueue_enqueue_compensations_pending", "Undo writes of failed enqueues waiting for Cassandra to answer",
)
#: Undo writes that failed are retried in the background with this policy, until they land.
COMPENSATION_BACKOFF = Backoff("enqueue compensation", initial_s=0.5, multiplier=2.0, max_s=10.0)
#: Past this many pending undo writes, new ones are only logged (an outage of hours under load).
MAX_PENDING_COMPENSATIONS = 100_000


@dataclasses.dataclass
class Attempt:
    """How far a failed attempt got: what its undo has to cover."""

    written: model.QueuedMail | None = None  # its view row may exist
    counted: bool = False  # and its counters were bumped
    #: Its claim was taken over from an attempt that may have written the row and published the
    #: message of this enqueue id: undone, the id is marked, whatever this attempt wrote (released
    #: unmarked, the next retry claimed a new id beside a live one: two mails for one key).
    taken_over: bool = False


class Compensation:
    def __init__(self, view: View, claims: KeyClaims) -> None:
        self._view = view
        self._claims = claims
        self._pending: set[asyncio.Task[None]] = set()

    async def undo(self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime, attempt: Attempt) -> None:
        """Undo a failed attempt (eventually): its mail marked deleted if its row may exist, then
        its idempotency claim (``key``, claimed at ``started``) released. Until the release lands
        (and a moment after: MAILQUEUE_ABANDONED_CLAIM_S), this process knows the claim failed and
        a retry here takes it over at once."""
        if key:
            self._claims.failed(queue, key, started)
        written = attempt.written

        async def undo() -> None:  # retried until it lands; the mark (and its counters) once
            nonlocal written
            if written is not None and attempt.counted:
                await self._view.mails.mark_gone(written, "enqueue failed", written_at=undo_time(started))
            elif written is not None or attempt.taken_over:  # (the earlier attempt's counts: the healer's)
                await self._view.mails.mark(queue, enqueue_id, "enqueue failed", undo_time(started))
            written, attempt.taken_over = None, False
            if key:
                await self._claims.release(queue, key, enqueue_id, started)

        if written is not None or key:
            await self.eventually(undo, "undo a failed enqueue")

    async def commit(self, queue: str, key: str, mail: model.QueuedMail, started: dt.datetime) -> bool:
        """Commit the mail's idempotency key (``KeyClaims.commit``), retried in the background if
        the backend does not answer (True then); False: a retry took the claim over, this attempt
        is to be undone."""
        held = True

        async def commit() -> None:
            nonlocal held
            held = await self._claims.commit(queue, key, mail, started)

        await self.eventually(commit, "commit idempotency key")
        return held

    async def abandon(
        self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime, error: BaseException, storing: bool,
        taken_over: bool = False,
    ) -> None:
        """Undo an attempt that failed before its group (nothing of its mail is in the view):
        ``error`` while claiming its key (``key`` claimed at ``started``), or while storing its
        content (``storing``). A claim that timed out, or whose caller left while it was in
        flight, may have landed: it is released (if it is ours), or the client's retry would find
        it in progress until it is abandoned (MAILQUEUE_ABANDONED_CLAIM_S). So is a claim that failed
        with an error nobody expected (in the background: the caller gets its own error). Only
        ``Aborted`` claimed nothing: another attempt holds the key."""
        if not key:
            return
        if isinstance(error, asyncio.CancelledError) and not storing:  # its caller left: not waited for
            self.undo_later(queue, key, enqueue_id, started, taken_over)
        elif storing or isinstance(error, BackendUnavailable):
            await self.undo(queue, key, enqueue_id, started, Attempt(taken_over=taken_over))
        elif not isinstance(error, Aborted):
            log.error("claiming idempotency key %s failed: %r; releasing it", validation.shown(key), error,
                      extra={"queue": queue})
            self.undo_later(queue, key, enqueue_id, started, taken_over)

    def undo_later(self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime, taken_over: bool = False) -> None:
        """``undo`` of an attempt that wrote nothing, from code that cannot wait (a caller that left).
        Its claim is known failed at once: a retry here takes it over without waiting for the task."""
        if key:
            self._claims.failed(queue, key, started)
        self._track(asyncio.ensure_future(self.undo(queue, key, enqueue_id, started, Attempt(taken_over=taken_over))),
                    "undo a withdrawn enqueue")

    async def eventually(self, op: Callable[[], Awaitable[None]], what: str) -> None:
        """Run a compensating (or bookkeeping) write; if the backend does not answer, keep retrying
        it in the background."""
        try:
            await op()
            return
        except BackendUnavailable as e:
            log.warning("could not %s, retrying in the background: %s", what, e)
        if len(self._pending) >= MAX_PENDING_COMPENSATIONS:
            log.error("could not %s and %d undo writes are pending already: given up", what, len(self._pending))
            return
        self._track(asyncio.ensure_future(retrying(op, COMPENSATION_BACKOFF, (BackendUnavailable,), log)), what)

    def _track(self, task: asyncio.Task[None], what: str) -> None:
        self._pending.add(task)
        COMPENSATIONS_PENDING.inc()

        def done(t: asyncio.Task[None]) -> None:
            self._pending.discard(t)
            COMPENSATIONS_PENDING.dec()
            if not t.cancelled() and t.exception() is not None:
                log.error("could not %s: %s", what, t.exception())

        task.add_done_callback(done)
