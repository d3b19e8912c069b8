"""The age of a queue's oldest mail and of its oldest deliverable mail, read from its first live
mails in enqueue order (pure; unit-tested).

- The oldest mail is the first live mail: its age is ``now - enqueued_at``.
- The oldest deliverable mail is the ready one (due at or before ``now``) that has waited longest
  since it became due: the age is ``now - min(due)`` over the ready mails. A mail is due at its
  ``deliver_at`` (a delay, a RETRY's backoff, a hold) or else at its enqueue time, never before
  its enqueue time. So once the scan reaches a mail enqueued at or after the earliest due seen,
  no later mail can be due earlier: the scan stops there, exact. In a queue with no delayed or
  retried mail that is the first ready mail.

The scan also stops after ``limit`` live mails (a queue whose head is thousands of delayed or
held mails): the deliverable age is then the longest wait among those, and says so (``exact``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from services.domain import model

#: Live mails a head scan looks at, at most (a first Browse page of the largest size).
HEAD_SCAN = 1000


@dataclasses.dataclass
class HeadScan:
    """Fed the live mails in enqueue order; ``add`` says when it has seen enough."""

    now: dt.datetime
    limit: int = HEAD_SCAN
    oldest: model.QueuedMail | None = None
    #: The earliest due instant among the ready mails seen.
    oldest_due: dt.datetime | None = None
    seen: int = 0
    #: True once nothing after the mails seen can change the ages.
    exact: bool = False

    def add(self, q: model.QueuedMail) -> bool:
        """Take the next live mail; True when the scan may stop."""
        if self.oldest is None:
            self.oldest = q
        if self.oldest_due is not None and q.enqueued_at >= self.oldest_due:
            self.exact = True  # this mail and every later one are due at or after their enqueue time
            return True
        self.seen += 1
        due = q.due()
        if due <= self.now:
            self.oldest_due = due if self.oldest_due is None else min(self.oldest_due, due)
            if q.enqueued_at >= self.oldest_due:
                self.exact = True
                return True
        return self.seen >= self.limit

    def end(self) -> None:
        """The queue has no more live mails: the ages are exact."""
        self.exact = True

    @property
    def oldest_age(self) -> dt.timedelta | None:
        """How long ago the oldest live mail was enqueued; None when the queue is empty."""
        return max(self.now - self.oldest.enqueued_at, dt.timedelta(0)) if self.oldest is not None else None

    @property
    def oldest_ready_age(self) -> dt.timedelta | None:
        """How long the oldest deliverable mail has been deliverable; None when no mail is ready."""
        return max(self.now - self.oldest_due, dt.timedelta(0)) if self.oldest_due is not None else None
