"""Operator rules: hold or bounce the mails matching a condition (KumoMTA-style suspend/bounce).

A rule applies to mails already queued and to mails enqueued while it lives, because it is
checked where every mail passes: dequeue, just before a delivery is handed out.
- hold: the delivery is re-scheduled (new generation, through the delay ladder) until the rule
  expires, or for ``HOLD_RECHECK`` at most, and recorded as held by the rule. Lifting the rule
  makes its held mails deliverable at once, in enqueue order. Held mails are never spun.
- bounce: the mail is marked ``bounced: <reason> (rule <id>)`` and dead-lettered. Adding a bounce
  rule also marks the queued mails it matches at once (browse and size stop counting them); their
  messages are dead-lettered when they come up.

Rules live in one small Cassandra partition, with a TTL to their expiry. Each process re-reads
it at most every ``REFRESH_S`` seconds when it needs it, so a rule reaches every replica within
that time.
"""

from __future__ import annotations

import datetime as dt
import uuid

from services.domain import filters, model, validation
from services.domain.errors import InvalidArgument
from services.domain.validation import queue_name, shown

#: Longest a rule may live.
MAX_LIFETIME = dt.timedelta(days=30)
DEFAULT_LIFETIME = dt.timedelta(days=1)
#: A held mail comes back this often at most, to see whether its rule still holds it.
HOLD_RECHECK = dt.timedelta(minutes=10)
REFRESH_S = 2.0
KINDS = ("hold", "bounce")


def matches(rule: model.Rule, q: model.QueuedMail) -> bool:
    m = q.mail
    if rule.queue and q.queue != rule.queue:
        return False
    if rule.sender and not filters.sender_is(rule.sender, m.sender):
        return False
    if rule.name and m.name != rule.name:
        return False
    if rule.recipient_domain and not filters.in_domain(m.recipients, rule.recipient_domain):
        return False
    return True


def validate(rule: model.Rule, now: dt.datetime) -> model.Rule:
    """The rule as it is stored (domain lower-cased), or InvalidArgument naming the field."""
    if rule.kind not in KINDS:
        raise InvalidArgument("rule.kind must be HOLD or BOUNCE")
    if not (rule.queue or rule.recipient_domain or rule.sender or rule.name):
        raise InvalidArgument("a rule needs a condition: queue, recipient_domain, sender or name")
    if rule.queue:
        queue_name(rule.queue)
    domain = validation.domain(rule.recipient_domain, "rule.recipient_domain") if rule.recipient_domain else ""
    if rule.sender and rule.sender != filters.NULL_SENDER_PATTERN:  # else a rule that matches nothing, silently
        validation.address(rule.sender, 'rule.sender (an address, or "<>" for the null sender)')
    for field in ("sender", "name", "reason"):
        if len(getattr(rule, field)) > 1000:
            raise InvalidArgument(f"rule.{field} is longer than 1000 characters")
    if rule.expires_at <= now:
        raise InvalidArgument("rule.expires_at is in the past")
    if rule.expires_at - now > MAX_LIFETIME:
        raise InvalidArgument("rule.expires_at is more than 30 days ahead")
    return model.Rule(rule.rule_id, rule.kind, rule.expires_at, rule.created_at, rule.queue, domain,
                      rule.sender, rule.name, rule.reason)


def bounce_reason(rule: model.Rule) -> str:
    return f"bounced: {rule.reason or 'by an operator rule'} (rule {rule.rule_id})"


def is_bounce(reason: str) -> bool:
    return reason.startswith("bounced: ")


def hold_until(rule: model.Rule, now: dt.datetime) -> dt.datetime:
    return min(rule.expires_at, now + HOLD_RECHECK)


def parse_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(f"rule id {shown(value)} is not a UUID (mailq rules lists the rules' ids)") from None
