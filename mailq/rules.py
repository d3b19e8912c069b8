"""mailq's hold and bounce rules: add one, list those in force, lift one.

    mailq hold|bounce [--queue Q] [--domain D] [--sender S] [--name N] [--for 1d] [--reason R]
    mailq rules
    mailq release RULE_ID
"""

from __future__ import annotations

import argparse
from typing import Any

from google.protobuf import timestamp_pb2

from mailq.common import Client, duration_arg, enum_text, print_table, queue_option, selector
from mailqueue.v1 import admin_pb2
from services.domain.durations import parse_duration


def cmd_rule(c: Client, a: argparse.Namespace) -> None:
    rule = admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD if a.command == "hold" else admin_pb2.RULE_KIND_BOUNCE,
                          queue=a.queue or "", recipient_domain=a.domain or "", sender=a.sender or "", name=a.name or "",
                          reason=a.reason or "")
    expires = timestamp_pb2.Timestamp()
    expires.GetCurrentTime()
    expires.FromSeconds(expires.seconds + int(a.lifetime.total_seconds()))
    rule.expires_at.CopyFrom(expires)
    r = c.admin.AddRule(admin_pb2.AddRuleRequest(rule=rule))
    print(f"{r.rule.rule_id} {a.command} until {r.rule.expires_at.ToDatetime().isoformat()}Z"
          + (f"; {r.applied} queued mail(s) bounced" if a.command == "bounce" else ""))


def cmd_rules(c: Client, a: argparse.Namespace) -> None:
    rows = []
    for r in c.admin.ListRules(admin_pb2.ListRulesRequest()).rules:
        condition = " ".join(f"{k}={v}" for k, v in (("queue", r.queue), ("domain", r.recipient_domain),
                                                      ("sender", r.sender), ("name", r.name)) if v)
        rows.append([r.rule_id, enum_text(admin_pb2.RuleKind, r.kind, "RULE_KIND_"), condition,
                     r.expires_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"), r.reason])
    print_table(rows, ["ID", "KIND", "CONDITION", "EXPIRES (UTC)", "REASON"])


def cmd_release(c: Client, a: argparse.Namespace) -> None:
    r = c.admin.LiftRule(admin_pb2.LiftRuleRequest(rule_id=a.rule_id))
    print(f"rule {a.rule_id} lifted; {r.released} held mail(s) released")


def register(sub: Any) -> None:
    for kind in ("hold", "bounce"):
        r = sub.add_parser(kind, help=f"{kind} the mails matching a condition (queued ones and new ones)")
        r.add_argument("--queue", type=queue_option, help="only this queue (default: every queue)")
        r.add_argument("--domain", type=selector, help="recipient domain")
        r.add_argument("--sender", type=selector)
        r.add_argument("--name", type=selector)
        r.add_argument("--for", dest="lifetime", type=duration_arg, default=parse_duration("1d"),
                       help="how long the rule lives (default 1d, at most 30d)")
        r.add_argument("--reason")
        r.set_defaults(fn=cmd_rule)
    sub.add_parser("rules", help="the hold and bounce rules in force").set_defaults(fn=cmd_rules)
    r = sub.add_parser("release", help="lift a rule (held mails go out now, in order)")
    r.add_argument("rule_id")
    r.set_defaults(fn=cmd_release)
