"""The dead-letter rules: a mark's reason read back as its kind, filters, the redrive rate."""

import dataclasses
import datetime as dt
import uuid

import pytest

from services.app.dead_letter_recorder import reason_for
from services.domain import dead_letters as dl
from services.domain import model, rules, schedule
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.timezone.utc)


def _expired() -> str:
    verdict = schedule.next_attempt(model.RetryPolicy(max_attempts=2), 2, NOW - dt.timedelta(hours=1), NOW, None)
    assert isinstance(verdict, schedule.Expired)
    return verdict.reason


@pytest.mark.parametrize("reason,kind", [
    # What each dead-lettering site writes (services/app/subscription.py, verdict.py, dead_letter_recorder.py).
    (_expired(), dl.EXPIRED),
    (_expired() + ": 451 4.7.1 greylisted", dl.EXPIRED),
    ("dead-lettered: 550 5.1.1 no such user", dl.REJECTED),
    ("dead-lettered", dl.REJECTED),
    (rules.bounce_reason(model.Rule(uuid.uuid4(), "bounce", NOW, NOW, reason="spam run")), dl.BOUNCED),
    ("dead-lettered: delivery limit of 20 reached, last delivery unanswered", dl.DELIVERY_LIMIT),
    (reason_for("delivery_limit", 20), dl.DELIVERY_LIMIT),
    (reason_for("expired", None), dl.OTHER),
    (dl.CONTENT_MISSING_REASON, dl.CONTENT_MISSING),
    # Marks that are not dead letters.
    ("dequeued", None), ("deleted by admin", None), ("moved to other", None), ("queue deleted", None), (None, None), ("", None),
    (dl.redriven_reason("other", "4a1c0e0e-0000-4000-8000-000000000000"), None), (dl.PURGED_REASON, None),
    # A client's REJECT text is kept as it is, not mistaken for another kind.
    ("dead-lettered: delivery limit of the remote site", dl.REJECTED),
])
def test_a_marks_reason_gives_its_kind(reason, kind):
    assert dl.kind_of(reason) == kind


def _letter(**changes) -> dl.DeadLetter:
    mail = model.QueuedMail(
        queue="q", enqueue_id=uuid.uuid4(), enqueued_at=NOW - dt.timedelta(hours=2),
        mail=model.Mail(name="n1", sender="a@example.com", recipients=("b@example.org",)), blob_ids=(), size=1,
        slice_start=NOW - dt.timedelta(hours=2), bucket=0,
    )
    d = dl.DeadLetter(mail, dl.REJECTED, "dead-lettered: 550", NOW - dt.timedelta(hours=1))
    return dataclasses.replace(d, **changes)


def test_filters_combine_with_and():
    d = _letter()
    assert dl.DeadLetterFilter().matches(d) and dl.DeadLetterFilter().empty
    assert dl.DeadLetterFilter(kinds=frozenset({dl.REJECTED, dl.EXPIRED})).matches(d)
    assert not dl.DeadLetterFilter(kinds=frozenset({dl.EXPIRED})).matches(d)
    assert dl.DeadLetterFilter(dead_before=NOW).matches(d)
    assert not dl.DeadLetterFilter(dead_before=NOW - dt.timedelta(hours=1)).matches(d)  # before is exclusive
    assert dl.DeadLetterFilter(dead_after=NOW - dt.timedelta(hours=1)).matches(d)
    assert not dl.DeadLetterFilter(dead_after=NOW).matches(d)
    assert dl.DeadLetterFilter(BrowseFilter(sender="a@example.com"), kinds=frozenset({dl.REJECTED})).matches(d)
    assert not dl.DeadLetterFilter(BrowseFilter(sender="a@example.com"), kinds=frozenset({dl.BOUNCED})).matches(d)
    assert not dl.DeadLetterFilter(BrowseFilter(recipient="c@example.org")).matches(d)
    assert not dl.DeadLetterFilter(BrowseFilter(name="n2")).empty


@pytest.mark.parametrize("asked,rate", [(0, dl.DEFAULT_REDRIVE_RATE), (1, 1), (dl.MAX_REDRIVE_RATE, dl.MAX_REDRIVE_RATE)])
def test_the_redrive_rate(asked, rate):
    assert dl.redrive_rate(asked) == rate


@pytest.mark.parametrize("asked", [-1, dl.MAX_REDRIVE_RATE + 1])
def test_a_redrive_rate_out_of_range_is_refused(asked):
    with pytest.raises(InvalidArgument, match="per_second"):
        dl.redrive_rate(asked)


def test_the_pacer_keeps_a_grid_from_the_start():
    p = dl.Pacer(10, start=100.0)
    assert p.delay(100.0) == 0  # the first at once
    assert p.delay(100.0) == pytest.approx(0.1)
    assert p.delay(100.5) == 0  # late: no wait, and no burst either...
    assert p.delay(100.5) == 0
    assert p.delay(100.5) == 0
    assert p.delay(100.5) == 0  # ...the 6th is due at 100.5
    assert p.delay(100.5) == pytest.approx(0.1)


def test_partitions_are_hours_of_enqueue():
    assert dl.hour_of(dt.datetime(1970, 1, 1, 1, 59, tzinfo=dt.timezone.utc)) == 1
    assert dl.hour_of(NOW) - dl.hour_of(NOW - dt.timedelta(minutes=61)) == 2
