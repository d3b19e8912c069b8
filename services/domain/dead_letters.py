"""Dead letters as a repository: what a dead letter is, why it died (its kind, read from the
reason its mark carries), which ones an operation takes, and how a redrive paces itself.

A mail is dead-lettered by a REJECT, by expiring (its retry policy), by a bounce rule, by
reaching the broker's delivery limit, or because its content is missing. Each of those writes a
mark whose reason starts in a known way (services/app/subscription.py, verdict.py,
dead_letter_recorder.py); ``kind_of`` reads the kind back, and answers None for marks that are
not dead letters (dequeued, deleted, moved, a deleted queue).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

from services.domain import model
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter

EXPIRED = "expired"
REJECTED = "rejected"
BOUNCED = "bounced"
DELIVERY_LIMIT = "delivery_limit"
CONTENT_MISSING = "content_missing"
OTHER = "other"
KINDS = (EXPIRED, REJECTED, BOUNCED, DELIVERY_LIMIT, CONTENT_MISSING, OTHER)

#: The prefix of every reason a dequeue verdict writes when it dead-letters (REJECT and the rest).
DEAD_LETTERED = "dead-lettered"
BY_THE_BROKER = "dead-lettered by the broker: "
CONTENT_MISSING_REASON = "dead-lettered: content missing"
_LIMIT = re.compile(r"dead-lettered: delivery limit of \d+ reached")


def redriven_reason(target: str, enqueue_id: str) -> str:
    """The mark a redriven dead letter's mail is left with: not a dead letter any more, so a
    late copy from the broker (redelivered after a consumer crash) does not list it again."""
    return f"redriven to {target} as {enqueue_id}"


#: The mark of a dead letter whose redrive was cut and whose target was deleted since: a dead
#: letter again (its kind in the repository: OTHER).
RETURNED_REASON = "dead-lettered: its redrive target was deleted"

#: The mark a purged dead letter's mail is left with (for the same late copies).
PURGED_REASON = "dead letter purged"

#: A redrive with no rate given goes at this many mails per second; the most a caller may ask.
DEFAULT_REDRIVE_RATE = 100
MAX_REDRIVE_RATE = 100_000


def kind_of(reason: str | None) -> str | None:
    """The dead-letter kind of a mark's reason; None when the mark is not a dead letter."""
    if not reason:
        return None
    if reason.startswith("expired: "):
        return EXPIRED
    if reason.startswith("bounced: "):
        return BOUNCED
    if reason == CONTENT_MISSING_REASON:
        return CONTENT_MISSING
    if _LIMIT.match(reason):
        return DELIVERY_LIMIT
    if reason.startswith(BY_THE_BROKER):
        return DELIVERY_LIMIT if reason.startswith(BY_THE_BROKER + "delivery limit") else OTHER
    if reason == DEAD_LETTERED or reason.startswith(DEAD_LETTERED + ": "):
        return REJECTED
    return None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A dead-lettered mail as the repository keeps it: the mail (with its attempts and last
    error), why it died and when."""

    mail: model.QueuedMail
    kind: str
    reason: str
    dead_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class DeadLetterFilter:
    """Conditions combine with AND; unset matches everything."""

    mails: BrowseFilter = BrowseFilter()
    kinds: frozenset[str] = frozenset()
    dead_after: dt.datetime | None = None
    dead_before: dt.datetime | None = None

    def matches(self, d: DeadLetter) -> bool:
        if self.kinds and d.kind not in self.kinds:
            return False
        if self.dead_after is not None and d.dead_at < self.dead_after:
            return False
        if self.dead_before is not None and d.dead_at >= self.dead_before:
            return False
        return self.mails.matches(d.mail)

    @property
    def empty(self) -> bool:
        return self == DeadLetterFilter()


def redrive_rate(per_second: int) -> int:
    if per_second < 0 or per_second > MAX_REDRIVE_RATE:
        raise InvalidArgument(f"per_second must be 0 (the default, {DEFAULT_REDRIVE_RATE}/s) to {MAX_REDRIVE_RATE}")
    return per_second or DEFAULT_REDRIVE_RATE


class Pacer:
    """At most ``rate`` per second from the first call: ``delay`` says how long to wait before
    the next one (a grid from the start, so a slow step is caught up, never burst past the rate)."""

    def __init__(self, rate: int, start: float) -> None:
        self._rate = rate
        self._start = start
        self._sent = 0

    def delay(self, now: float) -> float:
        due = self._start + self._sent / self._rate
        self._sent += 1
        return max(0.0, due - now)


def hour_of(instant: dt.datetime) -> int:
    """The repository's partition of a mail: hours since the epoch of its enqueue time."""
    return int(instant.timestamp() // 3600)
