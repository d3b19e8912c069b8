"""Queue lifecycle: creating a queue sets up its view rows and its broker topology."""

from __future__ import annotations

from services.domain import schedule, validation
from services.domain.model import RetryPolicy, utcnow
from services.domain.slices import slice_start
from services.ports.broker import Broker
from services.ports.view import View


async def create_queue(view: View, broker: Broker, queue: str, policy: RetryPolicy | None = None) -> bool:
    """Create ``queue`` idempotently; True when it is new.

    Order: topology, then the retry policy (only while the queue does not exist yet), then
    browse/content start (``IF NOT EXISTS``), then the queue row, so a queue is listed only once
    everything it needs exists. A crash half-way is healed by a retry.
    """
    validation.queue_name(queue)
    if policy is not None:
        schedule.validate(policy)
    await broker.declare_queue(queue)
    if policy is not None and not await view.queues.exists(queue):
        await view.retry_policies.set(queue, policy)
    config = await view.config.current()
    await view.starts.initialise(queue, slice_start(utcnow(), config.slice_window))
    return await view.queues.create(queue)
