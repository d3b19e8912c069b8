"""Which mails an operation takes: browse filters, delete and flush conditions, and the two
matches they share with the operator rules (services/domain/rules.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable

from services.domain import model, validation
from services.domain.errors import InvalidArgument

#: How a filter or a rule names the null sender (an empty MAIL FROM).
NULL_SENDER_PATTERN = "<>"

#: The most enqueue ids one DeleteMails or MoveMails takes (each costs an index read).
MAX_ENQUEUE_IDS = 1000


def sender_is(wanted: str, sender: str) -> bool:
    """The mail's sender is ``wanted`` (``"<>"``: the null sender), in any case: producers and
    operators spell one address differently (quotas lower-case senders too)."""
    return sender.lower() == (model.NULL_SENDER if wanted == NULL_SENDER_PATTERN else wanted.lower())


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
    #: Only the mail with this enqueue id (Browse's one id).
    enqueue_id: uuid.UUID | None = None
    #: Only the mails with one of these enqueue ids (DeleteMails, MoveMails: ``enqueue_ids``).
    enqueue_ids: frozenset[uuid.UUID] | None = None

    def matches(self, q: model.QueuedMail) -> bool:
        m = q.mail
        if self.held_by is not None and q.held_by != self.held_by:
            return False
        if self.enqueue_id is not None and q.enqueue_id != self.enqueue_id:
            return False
        if self.enqueue_ids is not None and q.enqueue_id not in self.enqueue_ids:
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


def enqueue_ids(values: Iterable[str]) -> frozenset[uuid.UUID]:
    """1 to MAX_ENQUEUE_IDS enqueue ids, each a UUID (duplicates count once); InvalidArgument
    otherwise, naming the first malformed one."""
    values = list(values)
    if not values:
        raise InvalidArgument("enqueue_ids is empty: give at least one enqueue id")
    if len(values) > MAX_ENQUEUE_IDS:
        raise InvalidArgument(f"{len(values)} enqueue ids exceed the limit of {MAX_ENQUEUE_IDS} a call: split them")
    return frozenset(validation.enqueue_id(v) for v in values)


def delete_condition(name: str | None = None, sender: str | None = None, recipient: str | None = None,
                     ids: Iterable[str] | None = None) -> BrowseFilter:
    """Exactly one of name / sender / recipient / enqueue ids, as a filter."""
    given = [v for v in (name, sender, recipient, ids) if v is not None]
    if len(given) != 1:
        raise InvalidArgument("a delete needs exactly one condition: name, sender, recipient or enqueue_ids")
    _not_empty(name=name, sender=sender, recipient=recipient)
    return BrowseFilter(sender=sender, recipient=recipient, name=name,
                        enqueue_ids=enqueue_ids(ids) if ids is not None else None)


def flush_condition(sender: str | None = None, recipient: str | None = None, recipient_domain: str | None = None,
                    name: str | None = None) -> BrowseFilter:
    """At most one condition (none: every delayed mail), as a filter of delayed mails."""
    given = [v for v in (sender, recipient, recipient_domain, name) if v is not None]
    if len(given) > 1:
        raise InvalidArgument("a flush takes at most one condition: sender, recipient, recipient_domain or name")
    _not_empty(sender=sender, recipient=recipient, name=name)
    if recipient_domain is not None:  # held to what a rule's or a throttle's is: "example.org." flushed nothing
        recipient_domain = validation.domain(recipient_domain, "recipient_domain")
    return BrowseFilter(sender=sender, recipient=recipient, name=name, schedule="delayed", recipient_domain=recipient_domain)


def _not_empty(**conditions: str | None) -> None:
    """A condition set to "" (an unset variable in a script) would select every mail without one,
    usually the whole queue: refused. The null sender is "<>"."""
    for field, value in conditions.items():
        if value is not None and not value.strip():
            raise InvalidArgument(f"the {field} condition is empty: give a value (the null sender is \"<>\"); "
                                  "nothing was changed")
