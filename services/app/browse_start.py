"""Browse start (DESIGN §4): the first slice that may still hold a live mail.

Every slice before browse start holds only deleted mails, so browse, size and the retention
sweep start there. It only moves forward, and never beyond ``now - slice_window`` (in-flight
writes and clock skew).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from services.domain import model
from services.domain.slices import slice_start, slices_between
from services.ports.view import View

log = logging.getLogger(__name__)

UPDATES = Counter("mailqueue_browse_start_updates_total", "Browse start updates attempted", ["queue"])


async def first_live_slice(view: View, queue: str, start: dt.datetime, limit: dt.datetime, config: model.ViewConfig) -> dt.datetime:
    """The first slice in [start, limit) holding a live mail, or ``limit`` when there is none."""
    for s in slices_between(start, limit - dt.timedelta(milliseconds=1), config.slice_window):
        # The first live mail is enough: a page per bucket at a time, not the whole slice.
        async for _ in view.mails.live_pages(queue, s, config.bucket_count, "browse_start"):
            return s
    return limit


async def update(
    view: View, queue: str, now: dt.datetime | None = None,
    moving: Callable[[dt.datetime, dt.datetime], Awaitable[None]] | None = None,
) -> dt.datetime | None:
    """Advance the queue's browse start as far as it may go; return the browse start in force.
    ``moving(from, to)`` is awaited before it moves (an operator's call records it there)."""
    UPDATES.labels(queue).inc()
    config = await view.config.current()
    current = await view.starts.browse_start(queue)
    if current is None:
        return None
    now = now or model.utcnow()
    limit = slice_start(now - config.slice_window, config.slice_window)
    if limit <= current:
        return current
    new = await first_live_slice(view, queue, current, limit, config)
    if new > current:
        if moving is not None:
            await moving(current, new)
        await view.starts.set_browse_start(queue, new)
        log.info("browse start advanced", extra={"queue": queue, "from": current.isoformat(), "to": new.isoformat()})
        return new
    return current


def should_update(pace: int, rng: random.Random = random._inst) -> bool:  # type: ignore[attr-defined]
    """The 1/pace die rolled after each mark-deleted."""
    return pace <= 1 or rng.randrange(pace) == 0
