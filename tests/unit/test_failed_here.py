"""The memory of claims whose enqueue attempt failed in this process (services/app/key_claims.py)."""

import datetime as dt

from services.app.key_claims import FailedHere

T0 = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(milliseconds=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_claim_is_held_for_keep_s_after_its_failure_then_not():
    clock = Clock()
    failed = FailedHere(30.0, clock)
    failed.add("q", "k", T0)
    clock.now += 30.0
    assert failed.holds("q", "k", T0)
    clock.now += 0.1
    assert not failed.holds("q", "k", T0)


def test_only_the_failed_attempts_claim_is_held_not_another_claim_of_its_key():
    """A duplicate that failed (its own claim timed out) while another attempt held the key, or a
    retry that claimed the key afresh since: their claims have another claimed_at."""
    failed = FailedHere(30.0, Clock())
    failed.add("q", "k", T0)
    assert failed.holds("q", "k", T0)
    assert not failed.holds("q", "k", T1)
    assert not failed.holds("q", "other", T0) and not failed.holds("other", "k", T0)


def test_failing_again_restarts_the_keep_time_and_expired_or_surplus_claims_are_dropped():
    clock = Clock()
    failed = FailedHere(30.0, clock, most=3)
    failed.add("q", "a", T0)
    failed.add("q", "b", T0)
    clock.now += 20
    failed.add("q", "a", T0)  # failed again: kept 30 s from now
    clock.now += 15
    failed.add("q", "c", T0)  # b (35 s old) is dropped; a (15 s) and c stay
    assert len(failed) == 2
    assert failed.holds("q", "a", T0) and failed.holds("q", "c", T0) and not failed.holds("q", "b", T0)
    failed.add("q", "d", T0)
    failed.add("q", "e", T0)  # four: the oldest (a) goes
    assert len(failed) == 3 and not failed.holds("q", "a", T0) and failed.holds("q", "e", T0)
