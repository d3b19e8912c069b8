"""Per-queue Prometheus gauges from the counters, refreshed in the background by browse_svc.

No mail row is read: each refresh reads the queue list and each queue's counter partition (the
dead-letter counts are in it too). Exported: ``mailqueue_queue_mails{queue,state}``
(state: ready, delayed, held, dead_lettered) and ``mailqueue_queue_oldest_deliverable_age_seconds``
(SQS's ApproximateAgeOfOldestMessage: the start of the oldest slice with a ready mail, so rounded
up to the slice window).
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Gauge

from services.domain import model
from services.domain.errors import BackendUnavailable
from services.ports.view import View

log = logging.getLogger(__name__)

MAILS = Gauge("mailqueue_queue_mails", "Mails per queue and state, from the queue counters", ["queue", "state"])
OLDEST = Gauge("mailqueue_queue_oldest_deliverable_age_seconds",
               "Age of the oldest deliverable mail (slice-rounded), 0 when none is ready", ["queue"])
REFRESH_SECONDS = Gauge("mailqueue_queue_gauges_refresh_seconds", "Time the last refresh of the queue gauges took")


async def refresh(view: View) -> int:
    """Set every queue's gauges once; the number of queues."""
    began = time.perf_counter()
    queues = await view.queues.all()
    now = model.utcnow()
    for queue in queues:
        try:
            c = await view.mails.size(queue)
            dead = sum((await view.dead_letters.counts(queue)).values())
        except BackendUnavailable as e:  # one queue's trouble leaves the others' gauges fresh
            log.warning("gauges of a queue not refreshed: %s", e, extra={"queue": queue})
            continue
        MAILS.labels(queue, "ready").set(c.ready)
        MAILS.labels(queue, "delayed").set(c.delayed - c.held)
        MAILS.labels(queue, "held").set(c.held)
        MAILS.labels(queue, "dead_lettered").set(dead)
        OLDEST.labels(queue).set((now - c.oldest_ready_slice).total_seconds() if c.oldest_ready_slice else 0)
    REFRESH_SECONDS.set(time.perf_counter() - began)
    return len(queues)


async def refresh_forever(view: View, interval_s: float) -> None:
    while True:
        try:
            await refresh(view)
        except BackendUnavailable as e:
            log.warning("queue gauges not refreshed: %s", e)
        await asyncio.sleep(interval_s)
