"""The head scan's ages (services/domain/ages.py): pure logic, no server."""

import datetime as dt
import uuid

from services.domain import ages, model

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
S = dt.timedelta(seconds=1)


def mail(enqueued_s_ago: float, deliver_in_s: float | None = None) -> model.QueuedMail:
    at = NOW - enqueued_s_ago * S
    return model.QueuedMail(
        queue="q", enqueue_id=uuid.uuid4(), enqueued_at=at, mail=model.Mail(name="m", sender="", recipients=("r@example.org",)), blob_ids=(), size=1,
        slice_start=at.replace(minute=0, second=0, microsecond=0), bucket=0,
        deliver_at=NOW + deliver_in_s * S if deliver_in_s is not None else None)


def scan(mails, limit: int = ages.HEAD_SCAN) -> tuple[ages.HeadScan, int]:
    """Feed the mails in order until the scan stops; how many it took."""
    s = ages.HeadScan(NOW, limit)
    for i, q in enumerate(mails):
        if s.add(q):
            return s, i + 1
    s.end()
    return s, len(mails)


def test_a_queue_of_ready_mails_stops_at_the_first_with_its_exact_age():
    s, taken = scan([mail(8.25), mail(5), mail(1)])
    assert taken == 1 and s.exact
    assert (s.oldest_age, s.oldest_ready_age) == (8.25 * S, 8.25 * S)


def test_delayed_mails_at_the_head_are_passed_over_to_the_first_ready_one():
    s, taken = scan([mail(60, deliver_in_s=600), mail(50, deliver_in_s=600), mail(40), mail(30)])
    assert taken == 3 and s.exact
    assert (s.oldest_age, s.oldest_ready_age) == (60 * S, 40 * S)


def test_a_retried_mail_due_again_counts_from_when_it_became_due_and_an_older_wait_behind_it_wins():
    # Enqueued 100 s ago, due again 10 s ago (a RETRY's backoff); the next mail has waited 90 s.
    s, taken = scan([mail(100, deliver_in_s=-10), mail(90), mail(5)])
    assert taken == 2 and s.exact
    assert (s.oldest_age, s.oldest_ready_age) == (100 * S, 90 * S)
    # Its wait is the longest when every mail behind it was enqueued after it became due.
    s, taken = scan([mail(100, deliver_in_s=-50), mail(40), mail(5)])
    assert taken == 2 and s.oldest_ready_age == 50 * S


def test_no_ready_mail_and_an_empty_queue():
    s, _ = scan([mail(60, deliver_in_s=600)])
    assert s.exact and s.oldest_age == 60 * S and s.oldest_ready_age is None
    s, _ = scan([])
    assert s.exact and s.oldest_age is None and s.oldest_ready_age is None


def test_the_scan_stops_after_its_limit_and_says_it_is_not_exact():
    s, taken = scan([mail(60 - i, deliver_in_s=600) for i in range(5)] + [mail(10)], limit=3)
    assert taken == 3 and not s.exact and s.oldest_ready_age is None
