"""One way to retry: a named backoff policy (services/domain/backoff.py), and ``[n/N]`` in every
retry's log line, run by tenacity.

Used where a backend error is waited out instead of returned: a delivery being prepared
(subscription.py) and the dead-letter recorder (dead_letter_recorder.py). S3's client retries its own
requests (services/adapters/s3/client.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import tenacity

from services.domain.backoff import Backoff

T = TypeVar("T")
_log = logging.getLogger(__name__)


async def retrying(
    op: Callable[[], Awaitable[T]], policy: Backoff, on: tuple[type[BaseException], ...],
    log: logging.Logger = _log, extra: dict[str, Any] | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``await op()`` until it returns; an exception in ``on`` is retried after the policy's
    delay (and re-raised once ``policy.attempts`` is spent), any other goes up at once.

    The first attempt is a plain await: a call that succeeds (nearly all of them, on the
    delivery path) pays nothing for the retry machinery, which costs ~50 us per call. From the
    first failure on, tenacity runs the attempts, waits and log lines.
    """
    try:
        return await op()
    except on as e:
        first = e
    if policy.attempts == 1:
        raise first

    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None and state.next_action is not None
        error = state.outcome.exception()
        assert error is not None
        log.warning("%s failed [%d/%s], retried in %.1f s: %s", policy.name, state.attempt_number,
                    policy.attempts or "unlimited", state.next_action.sleep, error, extra=extra)
        if on_retry is not None:
            on_retry(error)

    failed_once = True  # the plain attempt above: tenacity's first "attempt" replays its outcome

    async def attempt() -> T:
        nonlocal failed_once
        if failed_once:
            failed_once = False
            raise first
        return await op()

    retry = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(on),
        stop=tenacity.stop_after_attempt(policy.attempts) if policy.attempts else tenacity.stop_never,
        wait=lambda state: policy.delay(state.attempt_number),
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retry(attempt)
