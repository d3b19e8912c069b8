"""Retry backoff and expiry (services/domain/schedule.py)."""

import dataclasses
import datetime as dt

import pytest

from services.domain import schedule
from services.domain.errors import InvalidArgument
from services.domain.model import RetryPolicy

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
S = dt.timedelta(seconds=1)
POLICY = RetryPolicy(initial_backoff=60 * S, multiplier=2.0, max_backoff=3600 * S, max_attempts=5, max_age=dt.timedelta(days=5))


def test_backoff_grows_by_the_multiplier_up_to_the_maximum():
    assert [schedule.backoff(POLICY, n).total_seconds() for n in range(1, 9)] == [60, 120, 240, 480, 960, 1920, 3600, 3600]


@pytest.mark.parametrize(("multiplier", "attempt"), [(10.0, 311), (100.0, 157), (4.0, 600)])
def test_a_backoff_past_what_a_float_holds_is_the_maximum_not_an_overflow(multiplier, attempt):
    # A policy the API accepts (multiplier up to 100, max_attempts up to 1000): the RETRY raised
    # OverflowError, which failed the consumer's whole stream, again at each redelivery.
    policy = dataclasses.replace(POLICY, multiplier=multiplier, max_attempts=1000)
    assert schedule.backoff(policy, attempt) == policy.max_backoff


def test_a_retry_is_scheduled_after_its_backoff_or_the_consumer_retry_after():
    assert schedule.next_attempt(POLICY, 2, T0, T0 + S) == schedule.Retry(T0 + S + 120 * S)
    assert schedule.next_attempt(POLICY, 2, T0, T0 + S, retry_after=5 * S) == schedule.Retry(T0 + 6 * S)


def test_the_attempt_that_reaches_max_attempts_expires_the_mail():
    verdict = schedule.next_attempt(POLICY, 5, T0, T0 + dt.timedelta(hours=3))
    assert verdict == schedule.Expired("expired: 5 attempts over 3h (max_attempts 5)")


def test_a_retry_at_max_age_expires_and_none_is_scheduled_past_it():
    assert schedule.next_attempt(POLICY, 1, T0, T0 + dt.timedelta(days=5)) == schedule.Expired(
        "expired: 1 attempts over 5d (max_age 5d)")
    late = T0 + dt.timedelta(days=5) - 10 * S
    assert schedule.next_attempt(POLICY, 1, T0, late) == schedule.Retry(T0 + dt.timedelta(days=5))


@pytest.mark.parametrize("change", [
    {"multiplier": 0.5}, {"multiplier": float("nan")}, {"max_attempts": 0}, {"max_attempts": 1001},
    {"initial_backoff": -S}, {"max_backoff": 30 * S}, {"max_age": dt.timedelta(0)}, {"max_age": dt.timedelta(days=400)},
])
def test_policies_out_of_bounds_are_refused(change):
    with pytest.raises(InvalidArgument, match="retry_policy"):
        schedule.validate(dataclasses.replace(POLICY, **change))


def test_the_defaults_are_valid():
    assert schedule.validate(RetryPolicy()) == RetryPolicy()
