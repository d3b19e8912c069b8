"""Which mails an operation takes: browse filters, delete and flush conditions, and the two
matches they share with the operator rules (services/domain/rules.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable

from services.domain import model
from services.domain.errors import InvalidArgument

#: How a filter or a rule names the null sender (an empty MAIL FROM).
NULL_SENDER_PATTERN = "<>"


def sender_is(wanted: str, sender: str) -> bool:
    """The mail's sender is ``wanted`` (``"<>"``: the null sender)."""
    return sender == (model.NULL_SENDER if wanted == NULL_SENDER_PATTERN else wanted)


def in_domain(recipients: Iterable[str], domain: str) -> bool:
    """A recipient is in ``domain`` (lower case)."""
    return any(r.rsplit("@", 1)[-1].lower() == domain for r in recipients)


@dataclasses.dataclass(frozen=True)
class BrowseFilter:
    """Filters combine with AND; None matches everything. The null sender is ``"<>"``."""

    sender: str | None = None
    recipient: str | None = None
    name: str | None = None
    enqueued_after: dt.datetime | None = None
    enqueued_before: dt.datetime | None = None
    #: Recipient domain, lower case (a mail matches when any recipient is in it).
    recipient_domain: str | None = None
    #: "ready" (deliverable at ``now``) or "delayed" (deliver_at after ``now``).
    schedule: str | None = None
    now: dt.datetime | None = None
    #: Only mails this hold rule re-scheduled.
    held_by: uuid.UUID | None = None
    #: Only the mail with this enqueue id.
    enqueue_id: uuid.UUID | None = None

    def matches(self, q: model.QueuedMail) -> bool:
        m = q.mail
        if self.held_by is not None and q.held_by != self.held_by:
            return False
        if self.enqueue_id is not None and q.enqueue_id != self.enqueue_id:
            return False
        if self.schedule is not None:
            delayed = q.due() > (self.now or model.utcnow())
            if delayed != (self.schedule == "delayed"):
                return False
        if self.recipient_domain is not None and not in_domain(m.recipients, self.recipient_domain):
            return False
        if self.sender is not None and not sender_is(self.sender, m.sender):
            return False
        if self.recipient is not None and self.recipient not in m.recipients:
            return False
        if self.name is not None and m.name != self.name:
            return False
        if self.enqueued_after is not None and q.enqueued_at < self.enqueued_after:
            return False
        if self.enqueued_before is not None and q.enqueued_at >= self.enqueued_before:
            return False
        return True


def delete_condition(name: str | None, sender: str | None, recipient: str | None) -> BrowseFilter:
    """Exactly one of name / sender / recipient, as a filter."""
    given = [v for v in (name, sender, recipient) if v is not None]
    if len(given) != 1:
        raise InvalidArgument("a delete needs exactly one condition: name, sender or recipient")
    return BrowseFilter(sender=sender, recipient=recipient, name=name)


def flush_condition(sender: str | None = None, recipient: str | None = None, recipient_domain: str | None = None,
                    name: str | None = None) -> BrowseFilter:
    """At most one condition (none: every delayed mail), as a filter of delayed mails."""
    given = [v for v in (sender, recipient, recipient_domain, name) if v is not None]
    if len(given) > 1:
        raise InvalidArgument("a flush takes at most one condition: sender, recipient, recipient_domain or name")
    if recipient_domain is not None and (not recipient_domain or "@" in recipient_domain or len(recipient_domain) > 255):
        raise InvalidArgument("recipient_domain must be a domain name (the part after @)")
    return BrowseFilter(sender=sender, recipient=recipient, name=name, schedule="delayed",
                        recipient_domain=recipient_domain.lower() if recipient_domain else None)
