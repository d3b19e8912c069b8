"""Adding and lifting operator rules (services/domain/rules.py): what happens to the mails already queued."""

from __future__ import annotations

import dataclasses
import uuid

from services.app import counters
from services.app.browser import BrowseFilter, Browser
from services.domain import model, rules
from services.domain.errors import NotFound
from services.ports.view import View


async def add(view: View, browser: Browser, rule: model.Rule) -> tuple[model.Rule, int]:
    """Store the rule; a bounce rule also marks the queued mails it matches. (rule, mails marked)."""
    now = model.utcnow()
    rule = rules.validate(dataclasses.replace(rule, rule_id=uuid.uuid4(), created_at=now), now)
    if rule.queue and not await view.queues.exists(rule.queue):
        raise NotFound(f"queue {rule.queue!r} does not exist: create it with AdminService.CreateQueue")
    await view.rules.add(rule)
    applied = 0
    if rule.kind == "bounce":
        for queue in [rule.queue] if rule.queue else await view.queues.all():
            async for q in browser.live_mails(queue, "rule"):
                if rules.matches(rule, q):
                    await counters.mark(view, q, rules.bounce_reason(rule)[:1000])
                    applied += 1
    return rule, applied


async def lift(view: View, browser: Browser, rule_id: uuid.UUID) -> int:
    """End the rule now; a hold rule's held mails become deliverable, in enqueue order."""
    rule = await view.rules.get(rule_id)
    if rule is None:
        raise NotFound(f"rule {rule_id} does not exist or has expired (mailq rules lists the rules in force)")
    await view.rules.lift(rule_id)
    if rule.kind != "hold":
        return 0
    released = 0
    for queue in [rule.queue] if rule.queue else await view.queues.all():
        released += await browser.flush(queue, BrowseFilter(held_by=rule_id))
    return released
