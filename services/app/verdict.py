"""One delivery's verdict, as one unit: what to do with a message that arrived for a subscription.

``judge`` reads what decides it (the mail's mark or schedule, the operator rules, whether its
slice was swept, its content) and changes nothing; services/app/actions.py carries the verdict
out. Whether the mail's destination has room (traffic shaping, asked once before the verdict) is
an input. In the order of the checks:

0. no room, and not a delay's arrival: waits for room, before any read (a mail that waits costs
   one publish and one ack);
1. bounced while queued: dead-lettered; deleted: skipped; superseded (a RETRY or a Flush published
   a newer copy): skipped;
2. early (only a clock behind the publisher's): back to the delay ladder for the rest of its wait;
3. from here its delay (or hold) has ended (``arrived``): the counters are told;
4. a bounce rule matches: bounced; a hold rule: held;
5. its slice was swept: skipped;
6. no room (a delay's arrival, whose end the counters were told of by now): waits for room;
7. its content: carried by the message, read from the blob store, or only checked (large mail:
   the client reads it); missing: dead-lettered.

Raises BackendUnavailable when Cassandra or the blob store does not answer (the subscription
retries the whole verdict; nothing was changed).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum

from services.app.queue_state import QueueState
from services.app.rule_book import RuleBook
from services.domain import dead_letters, model
from services.domain.errors import NotFound
from services.ports.blobstore import BlobStore
from services.ports.broker import Message
from services.ports.view import MailQueueView


class Action(enum.Enum):
    DELIVER = "deliver"
    SKIP = "skip"  # acked, not handed out
    DEAD_LETTER = "dead-letter"
    WAIT = "wait"  # published again for the rest of its delay, then acked
    BOUNCE = "bounce"
    HOLD = "hold"
    WAIT_FOR_ROOM = "wait-for-room"  # published again to wait for room at its destination, then acked


@dataclasses.dataclass(frozen=True)
class Verdict:
    action: Action
    #: The metric label of a skip or a dead-letter ("deleted", "superseded", "swept", ...).
    reason: str = ""
    #: The delay (or hold) ended with this arrival: the counters' delayed (and held) counts drop.
    arrived: bool = False
    #: The mail's mark or schedule as read (None: live as enqueued).
    state: model.MailState | None = None
    #: WAIT: how much of its delay is left.
    early: dt.timedelta = dt.timedelta(0)
    #: BOUNCE, HOLD: the rule that matched.
    rule: model.Rule | None = None
    #: DELIVER: the content handed out inline (None for a large mail), and where it came from.
    content: bytes | None = None
    source: str = ""
    #: DEAD_LETTER: the mark to write first (a mail the view still shows live).
    mark: str | None = None


def carried(message: Message, mail: model.QueuedMail) -> bytes | None:
    """The content the message carries, if it carries all of it."""
    content = message.content
    return content if content is not None and len(content) == mail.size else None


async def judge(
    mails: MailQueueView, book: RuleBook, state: QueueState, blobs: BlobStore, inline_bytes: int,
    queue: str, message: Message, mail: model.QueuedMail, room: bool = True,
) -> Verdict:
    if not room and not message.delayed:
        return Verdict(Action.WAIT_FOR_ROOM, "shaped")
    current = await mails.state(queue, mail.enqueue_id)
    if current is not None and current.deleted:
        # Marked a dead letter (rejected, expired, bounced, ...) but its message came back: the
        # process died, or its channel was lost, between the mark and the nack. Dead-lettered now,
        # so the dead-letter list has it (services/app/dead_letter_recorder.py keeps it once).
        kind = dead_letters.kind_of(current.reason)
        if kind is not None:
            return Verdict(Action.DEAD_LETTER, kind, state=current)
        return Verdict(Action.SKIP, "deleted", state=current)
    if current is not None and mail.generation < current.generation:
        return Verdict(Action.SKIP, "superseded", state=current)
    early = mail.due() - model.utcnow()
    if early > dt.timedelta(0):
        return Verdict(Action.WAIT, "early", state=current, early=early)
    arrived = dict(arrived=True, state=current)
    rule = await book.first_match(mail)
    if rule is not None:
        return Verdict(Action.BOUNCE if rule.kind == "bounce" else Action.HOLD, "bounced" if rule.kind == "bounce" else "held",
                       rule=rule, **arrived)
    if await state.is_swept(queue, mail.slice_start):
        return Verdict(Action.SKIP, "swept", **arrived)
    if not room:
        return Verdict(Action.WAIT_FOR_ROOM, "shaped", **arrived)
    try:
        if mail.size <= inline_bytes:
            content, source = carried(message, mail), "message"
            if content is None:
                content, source = await blobs.read_content(mail.blob_ids, mail.size), "blob_store"
            return Verdict(Action.DELIVER, content=content, source=source, **arrived)
        for blob_id in mail.blob_ids:
            await blobs.stat(blob_id)
    except NotFound:
        return Verdict(Action.DEAD_LETTER, "content-missing", mark="dead-lettered: content missing", **arrived)
    return Verdict(Action.DELIVER, **arrived)
