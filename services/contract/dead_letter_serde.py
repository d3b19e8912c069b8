"""Dead letters' protobuf <-> domain translation (mailqueue/v1/browse.proto, admin.proto)."""

from __future__ import annotations

import datetime as dt

from mailqueue.v1 import browse_pb2
from services.contract.serde import duration_from_proto, queued_mail_to_proto, timestamp_from_proto, timestamp_to_proto
from services.domain import dead_letters
from services.domain.dead_letters import DeadLetter, DeadLetterFilter
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter

_KINDS = {
    browse_pb2.DEAD_LETTER_REASON_EXPIRED: dead_letters.EXPIRED,
    browse_pb2.DEAD_LETTER_REASON_REJECTED: dead_letters.REJECTED,
    browse_pb2.DEAD_LETTER_REASON_BOUNCED: dead_letters.BOUNCED,
    browse_pb2.DEAD_LETTER_REASON_DELIVERY_LIMIT: dead_letters.DELIVERY_LIMIT,
    browse_pb2.DEAD_LETTER_REASON_CONTENT_MISSING: dead_letters.CONTENT_MISSING,
    browse_pb2.DEAD_LETTER_REASON_OTHER: dead_letters.OTHER,
}
_KINDS_PB = {v: k for k, v in _KINDS.items()}


def _instant(pb: browse_pb2.DeadLetterFilter, field: str) -> dt.datetime | None:
    return timestamp_from_proto(getattr(pb, field), f"filter.{field}") if pb.HasField(field) else None


def filter_from_proto(pb: browse_pb2.DeadLetterFilter, older_than: object = None, now: dt.datetime | None = None) -> DeadLetterFilter:
    """The filter; ``older_than`` (a Duration, when set) ends the dead-lettered range at now - older_than."""
    kinds = set()
    for reason in pb.reasons:
        if reason not in _KINDS:
            raise InvalidArgument(f"filter.reasons: {reason} is not a dead-letter reason (leave reasons empty for every reason)")
        kinds.add(_KINDS[reason])
    before = _instant(pb, "dead_lettered_before")
    if older_than is not None:
        age = duration_from_proto(older_than, "older_than")  # type: ignore[arg-type]
        if age <= dt.timedelta(0):  # "older than now" is every dead letter: that takes all = true
            raise InvalidArgument("older_than must be above 0 (to purge every dead letter, set all = true)")
        cutoff = (now or dt.datetime.now(dt.timezone.utc)) - age
        before = cutoff if before is None else min(before, cutoff)
    mails = BrowseFilter(sender=pb.sender or None, recipient=pb.recipient or None, name=pb.name or None,
                         enqueued_after=_instant(pb, "enqueued_after"), enqueued_before=_instant(pb, "enqueued_before"))
    return DeadLetterFilter(mails, frozenset(kinds), _instant(pb, "dead_lettered_after"), before)


def dead_letter_to_proto(d: DeadLetter) -> browse_pb2.BrowseDeadLettersResponse:
    return browse_pb2.BrowseDeadLettersResponse(
        mail=queued_mail_to_proto(d.mail), reason=_KINDS_PB.get(d.kind, browse_pb2.DEAD_LETTER_REASON_OTHER),
        reason_text=d.reason, dead_lettered_at=timestamp_to_proto(d.dead_at),
    )


def counts_to_proto(counts: dict[str, int]) -> browse_pb2.CountDeadLettersResponse:
    return browse_pb2.CountDeadLettersResponse(
        total=sum(counts.values()),
        counts=[browse_pb2.DeadLetterCount(reason=_KINDS_PB[k], count=counts.get(k, 0)) for k in dead_letters.KINDS],
    )
