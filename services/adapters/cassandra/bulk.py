"""Many statements at once with the blocking driver (batch jobs: the sweep, benchmarks).

Requests that time out or find too few replicas are retried, a few times, at a lower
concurrency: a busy Cassandra (flushing, compacting) slows a batch job down instead of failing it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cassandra import OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

log = logging.getLogger(__name__)

RETRYABLE = (OperationTimedOut, ReadTimeout, WriteTimeout, Unavailable)
ATTEMPTS = 6


def run(session: Session, statement: Any, params: Sequence[tuple[Any, ...]], concurrency: int = 32) -> list[Any]:
    """Execute ``statement`` once per parameter tuple; the result rows of each, in order."""
    results: list[Any] = [None] * len(params)
    pending = list(range(len(params)))
    for attempt in range(ATTEMPTS):
        outcomes = execute_concurrent_with_args(
            session, statement, [params[i] for i in pending], concurrency=concurrency, raise_on_first_error=False
        )
        failed = []
        for i, (ok, value) in zip(pending, outcomes):
            if ok:
                results[i] = value
            elif isinstance(value, RETRYABLE) and attempt < ATTEMPTS - 1:
                failed.append(i)
            else:
                raise value
        if not failed:
            return results
        log.warning("retrying timed-out requests", extra={"requests": len(failed), "attempt": attempt + 1})
        pending, concurrency = failed, max(4, concurrency // 2)
    return results
