"""Idempotency keys at enqueue: an attempt claims its key, and a retry takes over a claim whose
attempt is gone.

An attempt with a key claims it (a lightweight transaction) before writing anything, naming its
enqueue id and its owner: this process's lease, a row of ``enqueuers`` that the process rewrites
every third of ``MAILQUEUE_CLAIM_LEASE_S`` with that TTL. A retry with the key (on any replica)
finds the claim and

- gets the earlier enqueue's result if it was committed;
- takes the claim over, keeping its enqueue id, if its attempt is gone: its owner's lease has
  expired (the process died: SIGKILL, OOM, a lost node, so within the lease of the death), or it
  failed in this process (that claim, by its ``claimed_at``, remembered for
  ``MAILQUEUE_ABANDONED_CLAIM_S``: its release pending or landed a moment ago), or it is older
  than ``MAILQUEUE_ABANDONED_CLAIM_S`` (an owner alive but stuck, or a claim of a version without
  leases);
- otherwise answers ABORTED: the attempt is in progress.

A take-over that does not apply (the claim changed since it was read: released, committed or
taken over meanwhile) reads the claim again, up to ``CLAIM_READS`` times.

A take-over is safe whenever it happens, even of an attempt that still runs (a lease lost to a
long pause): both attempts write and publish the same enqueue id, one mail, processed once (a
consumer's SUCCESS marks the enqueue id, and the other copy is skipped), and only the attempt
holding the claim commits it (the commit is conditional on the claim: the one taken over answers
ABORTED and is undone, whether the newer attempt succeeds or fails). The abandoned attempt's
undo marks are written at its start time plus 1 µs; the take-over removes marks written up to
that start plus 2 µs (last write wins in Cassandra), so an undo landing late cannot delete the
mail this attempt acknowledges, while a consumer's later SUCCESS mark stays.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from prometheus_client import Counter

from services.domain import model, validation
from services.domain.errors import Aborted, BackendUnavailable
from services.domain.settings import LimitSettings
from services.ports.view import View

log = logging.getLogger(__name__)

TAKEN_OVER = Counter("mailqueue_enqueue_claims_taken_over_total",
                     "Idempotency claims taken over by a retry, by why their attempt was deemed gone", ["reason"])

MICROSECOND = dt.timedelta(microseconds=1)
#: Reads of a claim per attempt: a take-over not applied (the claim changed since it was read) reads again.
CLAIM_READS = 3


def undo_time(started: dt.datetime) -> dt.datetime:
    """The write time of an attempt's undo marks: right after its start."""
    return started + MICROSECOND


class KeyClaims:
    """The claims of this enqueue process, and its lease."""

    def __init__(self, view: View, limits: LimitSettings) -> None:
        self._view = view
        self._limits = limits
        #: This process's lease: what its claims name as their owner.
        self.owner = uuid.uuid4()
        self._host = f"{socket.gethostname()}/{os.getpid()}"
        #: Set once the lease was written: no claim names it before.
        self._leased = asyncio.Event()
        #: Claims whose attempt failed here: a retry that meets one takes it over at once instead
        #: of waiting for it to be abandoned.
        self._failed = FailedHere(limits.abandoned_claim_s)

    async def keep_lease(self) -> None:
        """Renew the lease every third of ``claim_lease_s``, forever (a background task)."""
        lease_s = self._limits.claim_lease_s
        failing = False
        while True:
            begun = time.monotonic()
            try:
                await self._view.enqueuers.renew(self.owner, self._host, lease_s)
                if not self._leased.is_set():
                    log.info("enqueuer lease held", extra={"enqueuer": str(self.owner), "lease_s": lease_s})
                self._leased.set()
                failing = False
            except BackendUnavailable as e:
                if not failing:  # once per streak: its claims may be taken over meanwhile (safe, see above)
                    log.warning("could not renew the enqueuer lease: %s", e, extra={"enqueuer": str(self.owner)})
                failing = True
            await asyncio.sleep(max(0.0, lease_s / 3 - (time.monotonic() - begun)))

    async def claim(
        self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime,
    ) -> model.EnqueueResult | tuple[uuid.UUID, dt.datetime]:
        """Claim the idempotency key: the enqueue id to use with the instant its row is enqueued
        at (``started``, or a taken-over attempt's: the same row, written again, never a second
        one beside it), or the earlier enqueue's result. Raises Aborted while another attempt holds
        it, BackendUnavailable."""
        await self._lease_written()
        for _ in range(CLAIM_READS):
            held = await self._view.idempotency.claim(queue, key, enqueue_id, started, self.owner)
            if held is None or held.enqueue_id == enqueue_id:
                # Ours: the driver may retry the claim on another node after a node died with it
                # in flight, and the retry finds the row the first try wrote.
                return enqueue_id, started
            if held.result is not None:
                return held.result
            reason = await self._gone(queue, key, held, started)
            if reason is None:
                break
            at = held.enqueued_at or held.claimed_at  # where every attempt writes the mail's row
            if await self._view.idempotency.take_over(queue, key, started, held.claimed_at, self.owner,
                                                      held.enqueue_id, at):
                await self._undo_marks_of(queue, key, held, started)
                TAKEN_OVER.labels(reason).inc()
                log.warning("took over an idempotency claim whose attempt is gone", extra={
                    "queue": queue, "key": validation.shown(key), "enqueue_id": str(held.enqueue_id), "reason": reason,
                    "owner": str(held.owner), "claimed_s_ago": round((started - held.claimed_at).total_seconds(), 1)})
                return held.enqueue_id, at
            # Not applied: the claim changed since it was read (released, committed, or taken
            # over meanwhile by another retry): read it again.
        raise Aborted(f"an enqueue with idempotency key {validation.shown(key)} is in progress; retry in a few seconds")

    async def _undo_marks_of(self, queue: str, key: str, held: model.IdempotencyClaim, started: dt.datetime) -> None:
        """Remove the undo marks a taken-over attempt may have written (its own start plus 1 µs);
        the claim is this attempt's now, claimed at ``started``."""
        try:
            await self._view.mails.unmark(queue, held.enqueue_id, undo_time(held.claimed_at) + MICROSECOND)
        except BaseException:  # failed, or its caller left (cancelled)
            # Not released: the abandoned attempt may have written and published this enqueue
            # id. The claim stays (now ours), and a retry here takes it over again at once (not
            # ABORTED until it is abandoned).
            self._failed.add(queue, key, started)
            raise

    async def _gone(self, queue: str, key: str, held: model.IdempotencyClaim, now: dt.datetime) -> str | None:
        """Why the attempt holding ``held`` is gone, or None while it may be in progress."""
        if held.owner == self.owner and self._failed.holds(queue, key, held.claimed_at):
            return "failed here"
        if (now - held.claimed_at).total_seconds() > self._limits.abandoned_claim_s:
            return "abandoned"
        if held.owner is None or held.owner == self.owner:
            return None  # a version without leases (waits for "abandoned"), or in flight here
        return None if await self._view.enqueuers.alive(held.owner) else "owner gone"

    async def _lease_written(self) -> None:
        """Claims name the lease only once it exists: another replica would take them over at once."""
        if self._leased.is_set():
            return
        try:
            async with asyncio.timeout(self._limits.claim_lease_s):
                await self._leased.wait()
        except TimeoutError:
            raise BackendUnavailable("cassandra", "this enqueuer's lease is not written yet") from None

    async def commit(self, queue: str, key: str, mail: model.QueuedMail, started: dt.datetime) -> bool:
        """Commit the key to the enqueued ``mail``, if this attempt (claimed at ``started``) still
        holds its claim; False: a retry took it over (and answers for the key)."""
        held = await self._view.idempotency.commit(queue, key, mail, started)
        if not held:
            log.warning("an idempotency key's claim was taken over before its commit: the attempt is undone",
                        extra={"queue": queue, "key": validation.shown(key), "enqueue_id": str(mail.enqueue_id)})
        return held

    def failed(self, queue: str, key: str, started: dt.datetime) -> None:
        """The attempt started at ``started`` failed; its release may be pending: a retry here
        takes its claim over."""
        self._failed.add(queue, key, started)

    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime) -> None:
        """Release a failed attempt's claim (a claim taken over since is left alone)."""
        await self._view.idempotency.release(queue, key, enqueue_id, started)


class FailedHere:
    """The claims whose attempt failed in this process, each for ``keep_s`` after its failure (the
    age at which any claim is abandoned anyway), at most ``most`` (the oldest dropped first).

    A claim is named by its key and its ``claimed_at``: the start of the attempt that claimed it,
    or took it over. Not by enqueue id: an attempt whose take-over timed out (and may have landed)
    holds the claim under the taken-over id, not its own; and not by key alone: a duplicate that
    failed while the claim was another attempt's (its own claim timed out) must not make that live
    attempt's claim look failed. Kept past the claim's release: a retry whose claim read the row
    just before the release landed still finds it failed (it was answered ABORTED).
    """

    def __init__(self, keep_s: float, clock: Callable[[], float] = time.monotonic, most: int = 100_000) -> None:
        self._keep_s = keep_s
        self._clock = clock
        self._most = most
        #: (queue, key, claimed_at) -> when its attempt failed, in that order: the oldest first.
        self._at: dict[tuple[str, str, dt.datetime], float] = {}

    def add(self, queue: str, key: str, claimed_at: dt.datetime) -> None:
        now = self._clock()
        self._at.pop((queue, key, claimed_at), None)
        self._at[(queue, key, claimed_at)] = now
        oldest = next(iter(self._at))
        while now - self._at[oldest] > self._keep_s or len(self._at) > self._most:  # the one just added stops it
            del self._at[oldest]
            oldest = next(iter(self._at))

    def holds(self, queue: str, key: str, claimed_at: dt.datetime) -> bool:
        at = self._at.get((queue, key, claimed_at))
        return at is not None and self._clock() - at <= self._keep_s

    def __len__(self) -> int:
        return len(self._at)
