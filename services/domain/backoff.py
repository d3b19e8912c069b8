"""A retry policy as a value: how long to wait after each failure in a row, with jitter.

services/app/retry.py runs an operation under one (tenacity, asyncio).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable


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
