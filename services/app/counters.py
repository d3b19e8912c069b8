"""Counter updates as the use-cases make them: a mail's slice counters bumped, a live mail marked
gone with its counters (the counter model and its pure rules: services/domain/counts.py)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from services.domain import model
from services.domain.counts import is_held

if TYPE_CHECKING:
    from services.ports.view import View


async def bump(view: View, q: model.QueuedMail, **deltas: int) -> None:
    """Add ``deltas`` (kind=delta) to the mail's slice counters; best effort, gathered in the
    process for a moment (services/adapters/cassandra/counter_buffer.py). A mail counted
    ``enqueued`` adds its size to ``bytes``, one counted ``gone`` takes it off."""
    deltas["bytes"] = (deltas.get("enqueued", 0) - deltas.get("gone", 0)) * q.size
    for kind, delta in deltas.items():
        if delta:
            await view.counter_buffer.add(q.queue, kind, q.slice_start, delta)


async def mark(
    view: View, q: model.QueuedMail, reason: str, now: dt.datetime | None = None, written_at: dt.datetime | None = None,
) -> None:
    """Mark a live mail gone, with its counters. A mail still waiting for its delay (per its view
    row) also leaves the delayed (and held) counts: its message will be skipped, not counted, when
    it arrives. ``written_at``: see DeletedMailsDAO.mark."""
    await view.mails.mark(q.queue, q.enqueue_id, reason, written_at)
    waiting = q.due() > (now or model.utcnow())
    await bump(view, q, gone=1, delayed=-1 if waiting else 0, held=-1 if waiting and is_held(q) else 0)


async def mark_if_live(view: View, q: model.QueuedMail, reason: str) -> str | None:
    """``mark``, unless the mail was marked meanwhile (an operator deleted it while a consumer held
    it): None when marked now, with its counters; else the reason of the mark it has, and nothing
    counted (the earlier mark counted it)."""
    earlier = await view.mails.mark_if_live(q.queue, q.enqueue_id, reason)
    if earlier is None:
        waiting = q.due() > model.utcnow()
        await bump(view, q, gone=1, delayed=-1 if waiting else 0, held=-1 if waiting and is_held(q) else 0)
    return earlier
