"""One way to retry: named backoff policies, jitter, and ``[n/N]`` in every retry's log line.

Used where a backend error is waited out instead of returned: a delivery being prepared
(subscription.py), the dead-letter marker (dead_letters.py), S3's 5xx answers (s3async.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Wait ``initial_s`` after the first failure, ``multiplier`` times longer after each next
    one, at most ``max_s``; each wait varies by ±``jitter`` (a fraction) so that the processes
    an outage hit at once do not retry in step. ``attempts`` None: retry until it succeeds."""

    name: str
    initial_s: float
    multiplier: float = 2.0
    max_s: float = 15.0
    attempts: int | None = None
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.multiplier < 1 or self.max_s < self.initial_s or not 0 <= self.jitter < 1:
            raise ValueError(f"backoff {self.name!r}: need 0 <= initial_s <= max_s, multiplier >= 1, 0 <= jitter < 1")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"backoff {self.name!r}: attempts must be >= 1")

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1 = the first)."""
        base = min(self.initial_s * self.multiplier ** (failures - 1), self.max_s)
        return base * (1 + self.jitter * (2 * rand() - 1))


async def retrying(
    op: Callable[[], Awaitable[T]], policy: Backoff, on: tuple[type[BaseException], ...],
    log: logging.Logger = _log, extra: dict[str, Any] | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``await op()`` until it returns; an exception in ``on`` is retried after the policy's
    delay (and re-raised once ``policy.attempts`` is spent), any other goes up at once."""
    failures = 0
    while True:
        try:
            return await op()
        except on as e:
            failures += 1
            if policy.attempts is not None and failures >= policy.attempts:
                raise
            delay = policy.delay(failures)
            log.warning("%s failed [%d/%s], retried in %.1f s: %s", policy.name, failures,
                        policy.attempts or "unlimited", delay, e, extra=extra)
            if on_retry is not None:
                on_retry(e)
            await asyncio.sleep(delay)
