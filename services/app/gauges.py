"""Per-queue Prometheus gauges, refreshed in the background by browse_svc.

Each refresh reads the queue list and each queue's counter partition (the dead-letter counts are
in it too) and, for a queue the counters show live mails in, a head scan (services/app/ages.py:
about a first Browse page, reading on where the last one stopped). Exported:
``mailqueue_queue_mails{queue,state}`` (state: ready, delayed, held, dead_lettered) and
``mailqueue_queue_oldest_deliverable_age_seconds`` (SQS's ApproximateAgeOfOldestMessage: how long
the oldest deliverable mail has been deliverable, exact to the refresh).
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Gauge

from services.app.ages import HeadAges
from services.domain.errors import BackendUnavailable
from services.ports.view import View

log = logging.getLogger(__name__)

MAILS = Gauge("mailqueue_queue_mails", "Mails per queue and state, from the queue counters", ["queue", "state"])
OLDEST = Gauge("mailqueue_queue_oldest_deliverable_age_seconds",
               "How long the oldest deliverable mail has been deliverable (to the refresh), 0 when none is ready", ["queue"])
REFRESH_SECONDS = Gauge("mailqueue_queue_gauges_refresh_seconds", "Time the last refresh of the queue gauges took")


async def refresh(view: View, head: HeadAges) -> int:
    """Set every queue's gauges once; the number of queues."""
    began = time.perf_counter()
    queues = await view.queues.all()
    window = (await view.config.current()).slice_window
    for queue in queues:
        try:
            c = await view.mails.size(queue)
            dead = sum((await view.dead_letters.counts(queue)).values())
            scan = await head.scan(queue, c, window)
        except BackendUnavailable as e:  # one queue's trouble leaves the others' gauges fresh
            log.warning("gauges of a queue not refreshed: %s", e, extra={"queue": queue})
            continue
        MAILS.labels(queue, "ready").set(c.ready)
        MAILS.labels(queue, "delayed").set(c.delayed - c.held)
        MAILS.labels(queue, "held").set(c.held)
        MAILS.labels(queue, "dead_lettered").set(dead)
        age = scan.oldest_ready_age
        OLDEST.labels(queue).set(age.total_seconds() if age is not None else 0)
    _forget_deleted(set(queues))
    REFRESH_SECONDS.set(time.perf_counter() - began)
    return len(queues)


def _forget_deleted(listed: set[str]) -> None:
    """A deleted queue's series removed: left, its last depth and age would stay exported (and an
    age alert firing) until the process restarts."""
    for labels in {(m.labels["queue"], m.labels["state"]) for metric in MAILS.collect() for m in metric.samples}:
        if labels[0] not in listed:
            MAILS.remove(*labels)
    for metric in OLDEST.collect():
        for m in metric.samples:
            if m.labels["queue"] not in listed:
                OLDEST.remove(m.labels["queue"])


async def refresh_forever(view: View, head: HeadAges, interval_s: float) -> None:
    while True:
        try:
            await refresh(view, head)
        except BackendUnavailable as e:
            log.warning("queue gauges not refreshed: %s", e)
        await asyncio.sleep(interval_s)
