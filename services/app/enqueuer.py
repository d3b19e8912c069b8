"""Enqueue (DESIGN §4): one pipeline for every mail, whatever its content form (inline, blob
refs, a stream) and however many a call carries (Enqueue, EnqueueMany, EnqueueBatches):

1. ``_check``: the mail is valid, its queue exists, the broker does not block publishers (a
   RabbitMQ memory or disk alarm: refused at once, nothing written), blob refs exist (their size
   read, so the byte quotas know it, as inline content's), and, last, its quotas
   (services/app/quota_keeper.py: a mail refused for anything else takes nothing from a quota).
2. With an idempotency key, its claim (services/app/key_claims.py): the earlier enqueue's result
   answered again, or this attempt's enqueue id.
3. A stream's content put in the blob store, before the group (it arrives at the caller's pace,
   and a group must not wait for it).
4. The mail joins a group (``Grouper.submit``, services/app/enqueue_group.py; a lone call is a
   group of one, run at once) and the group's ``GroupWrites.run_group`` takes each step
   for every mail of the group together: inline content's blob writes, the view rows, the
   counters, the confirmed publishes, the ENQUEUED events, the idempotency commits. Each mail
   keeps its own outcome.

Every call comes in by ``enqueue``; steps 1-4 are ``_enqueue``, one method read top to bottom;
each content form only builds its ``Pending`` mail (and, for a stream, the step 3 that stores
its content).

A mail is acknowledged only after its blob, its view row and its confirmed RabbitMQ message all
exist. On any failure after the row may have been written, the mail is undone (marked deleted,
then its claim released: services/app/compensation.py) and the caller gets BackendUnavailable:
nothing half-enqueued is ever delivered or browsed.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from services.app.compensation import Compensation
from services.app.enqueue_group import ENQUEUE_FAILED, Grouper, GroupWrites, Pending, Schedule, refuse_if_blocked, to_millis
from services.app.key_claims import KeyClaims
from services.app.queue_state import QueueState
from services.app.quota_keeper import QuotaKeeper
from services.domain import events as mail_events
from services.domain import model, quotas, validation
from services.domain.errors import BackendUnavailable, InvalidArgument, MailQueueError, NotFound, ResourceExhausted
from services.domain.settings import LimitSettings
from services.ports.blobstore import BlobStore
from services.ports.broker import Broker
from services.ports.events import EventLog, Unrecorded
from services.ports.view import View

log = logging.getLogger(__name__)

#: The step that stores or checks a call's content before its group: (blob ids, size).
ContentWriter = Callable[[], Awaitable[tuple[tuple[str, ...], int]]]


class Enqueuer:
    def __init__(
        self, view: View, broker: Broker, blobs: BlobStore, limits: LimitSettings, state: QueueState,
        events: EventLog | None = None, quota_keeper: QuotaKeeper | None = None,
    ) -> None:
        self._view = view
        #: Enqueue quotas and depth limits, checked last before anything is written (None: none).
        self.quotas = quota_keeper
        #: Each acknowledged enqueue's ENQUEUED event is recorded before the reply (services/domain/events.py builds it).
        self._events: EventLog = events if events is not None else Unrecorded()
        self._broker = broker
        self._blobs = blobs
        self._limits = limits
        self._state = state
        #: Idempotency keys: claims, take-overs, and this process's lease (services/app/key_claims.py).
        self.claims = KeyClaims(view, limits)
        compensation = Compensation(view, self.claims)
        self._compensation = compensation
        #: A lone call is a group of one (services/app/enqueue_group.py).
        self._grouper = Grouper(GroupWrites(view, broker, blobs, state, self._events, compensation), compensation)

    # ------------------------------------------------------------------ the one entry
    async def enqueue(
        self, queue: str, mail: model.Mail, content: Content, key: str = "", when: Schedule = (None, None),
        priority: str = "normal",
    ) -> model.EnqueueResult:
        """Enqueue one mail, whatever its content form; steps 1-4 of the module's docstring."""
        if isinstance(content, Streamed):
            return await self._enqueue_stream(Pending(queue, mail, when, priority, key=key), content.chunks)
        if isinstance(content, Inline):
            if not content.data:  # as a stream with no chunk: a producer whose read failed
                raise InvalidArgument("inline_content is empty: send the mail's bytes")
            self._check_mail_size(len(content.data))
            if len(content.data) > self._limits.max_inline_bytes:
                raise ResourceExhausted(
                    f"inline content is {len(content.data)} bytes, over the limit of {self._limits.max_inline_bytes}: "
                    "use EnqueueStream or put the content with BlobService.Put first"
                )
            return await self._enqueue(Pending(
                queue, mail, when, priority, content=content.data, size=len(content.data), key=key,
                carried=self._limits.carried(content.data, len(content.data)),
            ))
        if not content.blob_ids:
            raise InvalidArgument("blob_refs must name at least one blob")
        return await self._enqueue(Pending(queue, mail, when, priority, blob_ids=tuple(content.blob_ids), key=key))

    async def _enqueue_stream(self, item: Pending, chunks: AsyncIterator[bytes]) -> model.EnqueueResult:
        """A streamed mail: its content is stored after the checks and the claim, before its group;
        its bytes are taken from its byte quotas as they arrive (streams at once share a quota)."""
        facts = quotas.Facts(quotas.current_tenant.get(), item.mail.sender, item.queue, 0)
        charge = quotas.Charge()  # the mail's, and its bytes' as they arrive; names this stream to the quotas

        async def limited() -> AsyncIterator[bytes]:
            total = 0
            async for chunk in chunks:
                total += len(chunk)
                self._check_mail_size(total)
                if self.quotas is not None:
                    self.quotas.stream(facts, len(chunk), charge)
                yield chunk
            if total == 0:  # a header alone (a client whose read failed), as unary Enqueue with no content
                raise InvalidArgument("EnqueueStream carried no content after its header: send the mail's bytes as chunks")

        async def put() -> tuple[tuple[str, ...], int]:  # the content streams to the blob store on its own
            info = await self._blobs.put(limited())
            return (info.blob_id,), info.size

        try:
            return await self._enqueue(item, put, charge)
        finally:
            if self.quotas is not None:
                self.quotas.stream_ended(charge)

    def _check_mail_size(self, size: int) -> None:
        if size > self._limits.max_mail_bytes:
            raise ResourceExhausted(f"mail content exceeds the limit of {self._limits.max_mail_bytes} bytes")

    async def _measured(self, blob_ids: tuple[str, ...]) -> int:
        """The size of a mail given by blob refs, read before the quotas take it (charged after the
        write, concurrent mails would all pass them), once the queue and the broker take mail;
        each blob's write time is refreshed with the same call, so a retention sweep under way
        keeps it (a mail then refused by a quota or its size refreshed it too: harmless)."""
        size = 0
        for b, times in collections.Counter(blob_ids).items():  # each blob read once, however often the mail names it
            try:
                size += (await self._blobs.keep(b)).size * times
            except NotFound:
                raise NotFound(f"blob {b} not found: put the content with BlobService.Put first") from None
            self._check_mail_size(size)
        if size == 0:  # as inline content or a stream with none: a producer whose read failed
            raise InvalidArgument("blob_refs name only empty blobs: the mail has no content")
        return size

    # ------------------------------------------------------------------ the one path
    async def _enqueue(
        self, item: Pending, content: ContentWriter | None = None, charge: quotas.Charge | None = None,
    ) -> model.EnqueueResult:
        """Steps 1-4 of the module's docstring. ``content`` stores a stream's content before the
        group; None for inline content (the group stores it) and blob refs (stored before).
        ``charge``: what the mail takes from its quotas (a stream's, which its chunks add to)."""
        charge = charge if charge is not None else quotas.Charge()
        earlier: model.EnqueueResult | None = None
        try:
            item = await self._check(item, charge)
        except quotas.QuotaExceeded:
            # A resend of a mail already enqueued gets its earlier answer, not a refusal: it adds
            # nothing to the queue. One read, only when a keyed mail is refused.
            earlier = await self._view.idempotency.committed(item.queue, item.key) if item.key else None
            if earlier is None:
                raise
        # What the quotas took goes back if the mail is refused after all (a refused mail takes
        # nothing from a quota, whatever refuses it), or if it is a resend (charged once, with its
        # first send), or if its caller left before it joined a group. Not once it joined one: its
        # mail may be enqueued all the same (its group goes on), and leaving must not be a way
        # around a rate.
        try:
            result, fresh = await self._enqueue_checked(item, earlier, content, charge)
        except MailQueueError:
            charge.give_back(time.monotonic())
            raise
        except BaseException:  # the caller left: given back unless its mail joined a group
            if not charge.committed:
                charge.give_back(time.monotonic())
            raise
        if not fresh:
            charge.give_back(time.monotonic())
        return result

    async def _enqueue_checked(
        self, item: Pending, earlier: model.EnqueueResult | None, content: ContentWriter | None, charge: quotas.Charge,
    ) -> tuple[model.EnqueueResult, bool]:
        """Steps 2-4, once the mail passed its checks: its result, and whether it is a new mail
        (False: the earlier enqueue of its idempotency key answered again)."""
        # Step 2 claims the key: the earlier enqueue's result (answered again), or the enqueue id to
        # use (a new one, or the one of an attempt taken over); the claim's instant is kept to the
        # millisecond, as Cassandra keeps it: the write time of its undo marks (services/app/key_claims.py).
        enqueue_id, started = uuid.uuid4(), to_millis(model.utcnow())
        storing = False  # step 3 began: whatever fails in it (nothing is written yet) releases the claim
        taken_over = False  # the claim of an attempt gone, which may have written this enqueue id
        try:
            if item.key and earlier is None:
                held = await self.claims.claim(item.queue, item.key, enqueue_id, started)
                if isinstance(held, model.EnqueueResult):
                    earlier = held
                else:
                    enqueue_id, at = held
                    taken_over = at != started
                    item = dataclasses.replace(item, enqueue_id=enqueue_id, started=started, at=at, taken_over=taken_over)
            if earlier is None and content is not None:
                storing = True
                blob_ids, size = await content()
                item = dataclasses.replace(item, blob_ids=blob_ids, size=size)
        except BaseException as e:
            if storing and isinstance(e, BackendUnavailable):
                ENQUEUE_FAILED.labels(item.queue).inc()
            await self._compensation.abandon(item.queue, item.key, enqueue_id, started, e, storing, taken_over)
            raise
        if earlier is not None:  # its ENQUEUED event recorded again, with the same id, marked resent
            await self._record_resent(item.queue, earlier)
            return earlier, False
        def started() -> None:  # from here its group enqueues it whatever its caller does
            charge.committed = True

        return await self._grouper.submit(item, started), True

    async def _record_resent(self, queue: str, earlier: model.EnqueueResult) -> None:
        """The earlier enqueue's ENQUEUED event again (same id, same time: it overwrites it), marked
        resent, built from its mail as queued (its name, sender and trace context, whatever the
        resend carries); none once the mail is no longer queued (its story has gone on)."""
        try:
            queued = await self._view.mails.indexed(queue, "enqueue_id", earlier.enqueue_id, "resend")
        except BackendUnavailable as e:  # the resend is answered all the same: its first send was recorded
            log.warning("could not read the mail of a resend: its ENQUEUED event is not marked resent: %s", e,
                        extra={"queue": queue, "enqueue_id": str(earlier.enqueue_id)})
            return
        if queued:
            await self._events.record([mail_events.resent(queued[0], earlier)])

    async def _check(self, item: Pending, charge: quotas.Charge) -> Pending:
        """Refuse what is invalid, what could not be published now, or what a quota refuses (last:
        a mail refused for anything else takes nothing from a quota), before anything is written
        (but blob refs' write times, refreshed as their size is read).
        Blob refs are measured once the rest passed (a refused mail reads no blob): the mail is
        returned with its size. A stream's size is 0 here: its bytes are taken as they arrive."""
        validation.blob_refs(item.blob_ids)
        validation.queue_name(item.queue)
        validation.mail(item.mail, self._limits)
        validation.deliver_at(model.utcnow(), *item.when)  # refused beyond MAX_DELAY; the row takes it from its own time
        if len(item.key) > 256:
            raise InvalidArgument("idempotency_key is longer than 256 characters")
        await self._state.require_queue(item.queue)
        refuse_if_blocked(self._broker, item.queue)
        if item.blob_ids:
            item = dataclasses.replace(item, size=await self._measured(item.blob_ids))
        if self.quotas is not None:
            self.quotas.check(quotas.Facts(quotas.current_tenant.get(), item.mail.sender, item.queue, item.size), charge)
        return item


@dataclasses.dataclass(frozen=True)
class Inline:
    """Content carried by the call itself (at most ``MAILQUEUE_MAX_INLINE_BYTES``)."""

    data: bytes


@dataclasses.dataclass(frozen=True)
class BlobRefs:
    """Content put in the blob store before (BlobService.Put), named by its blob ids."""

    blob_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Streamed:
    """Content streamed in chunks after the call's header (EnqueueStream)."""

    chunks: AsyncIterator[bytes]


#: The three content forms of a mail.
Content = Inline | BlobRefs | Streamed
