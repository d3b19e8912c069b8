"""The memory of keys whose enqueue attempt failed in this process (services/app/key_claims.py)."""

from services.app.key_claims import FailedHere


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_key_is_held_for_keep_s_after_its_failure_then_not():
    clock = Clock()
    failed = FailedHere(30.0, clock)
    failed.add("q", "k")
    clock.now += 30.0
    assert failed.holds("q", "k")
    clock.now += 0.1
    assert not failed.holds("q", "k")
    assert not failed.holds("q", "other") and not failed.holds("other", "k")


def test_a_key_claimed_again_here_is_forgotten():
    failed = FailedHere(30.0, Clock())
    failed.add("q", "k")
    failed.forget("q", "k")
    assert not failed.holds("q", "k")
    failed.forget("q", "never failed")  # nothing to forget: no error


def test_failing_again_restarts_the_keep_time_and_expired_keys_are_dropped_as_others_fail():
    clock = Clock()
    failed = FailedHere(30.0, clock)
    failed.add("q", "a")
    failed.add("q", "b")
    clock.now += 20
    failed.add("q", "a")  # failed again: kept 30 s from now
    clock.now += 15
    failed.add("q", "c")  # b (35 s old) is dropped; a (15 s) and c stay
    assert len(failed) == 2
    assert failed.holds("q", "a") and failed.holds("q", "c") and not failed.holds("q", "b")
