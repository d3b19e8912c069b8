"""When a mail is delivered again, and when it expires (pure functions, unit-tested).

A RETRY counts one attempt. The n-th attempt waits ``retry_after`` when the consumer gave one,
otherwise ``min(initial_backoff * multiplier**(n-1), max_backoff)``. A RETRY that reaches
``max_attempts``, or comes when the mail is ``max_age`` old, expires the mail; a retry is never
scheduled past ``enqueued_at + max_age``, so the last attempt happens at that age at the latest.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from services.domain.delays import MAX_DELAY
from services.domain.durations import human
from services.domain.errors import InvalidArgument
from services.domain.model import RetryPolicy

MAX_ATTEMPTS = 1000
MAX_MULTIPLIER = 100.0


@dataclasses.dataclass(frozen=True)
class Retry:
    """Deliver again at ``deliver_at``."""

    deliver_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class Expired:
    """The mail expires: dead-lettered, marked with ``reason``."""

    reason: str


def backoff(policy: RetryPolicy, attempt: int) -> dt.timedelta:
    """The pause before delivery ``attempt + 1`` (``attempt`` counts from 1)."""
    try:
        seconds = policy.initial_backoff.total_seconds() * policy.multiplier ** min(attempt - 1, 1000)
    except OverflowError:  # x10 past attempt 310, x100 past 156: far above any cap
        seconds = MAX_DELAY.total_seconds()
    return min(dt.timedelta(seconds=min(seconds, MAX_DELAY.total_seconds())), policy.max_backoff)


def next_attempt(
    policy: RetryPolicy, attempts: int, enqueued_at: dt.datetime, now: dt.datetime,
    retry_after: dt.timedelta | None = None,
) -> Retry | Expired:
    """What a RETRY does to a mail that has now had ``attempts`` RETRYs (this one included)."""
    age = now - enqueued_at
    if attempts >= policy.max_attempts:
        return Expired(f"expired: {attempts} attempts over {human(age)} (max_attempts {policy.max_attempts})")
    if age >= policy.max_age:
        return Expired(f"expired: {attempts} attempts over {human(age)} (max_age {human(policy.max_age)})")
    wait = backoff(policy, attempts) if retry_after is None else max(retry_after, dt.timedelta(0))
    return Retry(min(now + wait, enqueued_at + policy.max_age))


def validate(p: RetryPolicy) -> RetryPolicy:
    """InvalidArgument naming the field when a policy is out of bounds; the policy otherwise."""
    if not dt.timedelta(0) <= p.initial_backoff <= MAX_DELAY:
        raise InvalidArgument(f"retry_policy.initial_backoff must be from 0 to {human(MAX_DELAY)}")
    if not dt.timedelta(0) <= p.max_backoff <= MAX_DELAY:
        raise InvalidArgument(f"retry_policy.max_backoff must be from 0 to {human(MAX_DELAY)}")
    if p.max_backoff < p.initial_backoff:
        raise InvalidArgument("retry_policy.max_backoff must not be below initial_backoff")
    if not 1.0 <= p.multiplier <= MAX_MULTIPLIER:  # also refuses NaN
        raise InvalidArgument(f"retry_policy.multiplier must be from 1 to {MAX_MULTIPLIER:g}")
    if not 1 <= p.max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(f"retry_policy.max_attempts must be from 1 to {MAX_ATTEMPTS}")
    if not dt.timedelta(0) < p.max_age <= MAX_DELAY:
        raise InvalidArgument(f"retry_policy.max_age must be above 0 and at most {human(MAX_DELAY)}")
    return p
