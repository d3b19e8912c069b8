"""mailq throttle: traffic shaping per destination (AdminService's shaping RPCs)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from mailq.common import UsageError, duration, duration_arg, enum_text, print_table, queue_option, whole
from mailqueue.v1 import admin_pb2, shaping_pb2
from services.domain import shaping
from services.domain.errors import InvalidArgument

_PERIODS = {"s": shaping_pb2.RATE_PERIOD_SECOND, "m": shaping_pb2.RATE_PERIOD_MINUTE,
            "h": shaping_pb2.RATE_PERIOD_HOUR, "d": shaping_pb2.RATE_PERIOD_DAY}
_NAMES = {v: k for k, v in _PERIODS.items()}


def rate_arg(text: str) -> shaping_pb2.Rate:
    try:
        r = shaping.parse_rate(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return shaping_pb2.Rate(count=r.count, per=_PERIODS[r.per])


def rate_text(r: shaping_pb2.Rate) -> str:
    return f"{r.count}/{_NAMES.get(r.per, '?')}" if r.count else "-"


def _when(ts: Any) -> str:
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")


def cmd_set(c: Any, a: argparse.Namespace) -> None:
    if a.rate is None and not a.concurrency:
        raise UsageError("mailq throttle set: give --rate, --concurrency or both")
    t = shaping_pb2.Throttle(destination=a.destination, queue=a.queue or "", concurrency=a.concurrency or 0)
    if a.rate is not None:
        t.rate.CopyFrom(a.rate)
    r = c.admin.SetThrottle(admin_pb2.SetThrottleRequest(throttle=t)).throttle
    print(f"{r.destination} ({r.queue or 'every queue'}): rate {rate_text(r.rate)}, concurrency {r.concurrency or '-'}")


def cmd_clear(c: Any, a: argparse.Namespace) -> None:
    r = c.admin.ClearThrottle(admin_pb2.ClearThrottleRequest(destination=a.destination, queue=a.queue or ""))
    print("cleared" if r.cleared else "no such throttle")


def cmd_list(c: Any, a: argparse.Namespace) -> None:
    r = c.admin.ListThrottles(admin_pb2.ListThrottlesRequest(queue=a.queue or ""))
    print_table([[t.destination, t.queue or "*", rate_text(t.rate), str(t.concurrency or "-")] for t in r.throttles],
                ["DESTINATION", "QUEUE", "RATE", "CONCURRENCY"])
    if r.effects:
        print()
        print_table([[e.destination, enum_text(shaping_pb2.ShapingAction, e.action, "SHAPING_ACTION_"), e.rule_id,
                      _when(e.started_at), _when(e.ends_at), rate_text(e.current_rate)] for e in r.effects],
                    ["DESTINATION", "EFFECT", "RULE", "SINCE (UTC)", "ENDS (UTC)", "RATE NOW"])
    if r.rules:
        print()
        print_table([[x.rule_id, x.pattern, f"{x.threshold} in {x.window.ToTimedelta()}",
                      enum_text(shaping_pb2.ShapingAction, x.action, "SHAPING_ACTION_")
                      + (f" to {rate_text(x.floor)}" if x.HasField("floor") else ""), str(x.duration.ToTimedelta())]
                     for x in r.rules], ["RULE", "PATTERN", "THRESHOLD", "ACTION", "FOR"])
    if r.sites:
        print()
        print_table([[s.name, ", ".join(s.domains)] for s in r.sites], ["SITE", "DOMAINS"])
    print(f"\n{r.members} dequeue replica(s) share the limits")


def print_status(r: admin_pb2.ListThrottlesResponse) -> None:
    """Per shaped destination: what the replicas report, and its limits and effect."""
    limits: dict[str, list[str]] = {}
    for t in r.throttles:
        limits.setdefault(t.destination, []).append(
            f"{t.queue or '*'}: " + ", ".join(x for x in (rate_text(t.rate) if t.rate.count else "", f"{t.concurrency} at once" if t.concurrency else "") if x))
    effects = {e.destination: f"{enum_text(shaping_pb2.ShapingAction, e.action, 'SHAPING_ACTION_')} until {_when(e.ends_at)}"
               for e in r.effects}
    status = {d.destination: d for d in r.destinations}
    rows = []
    for dest in sorted(set(limits) | set(effects) | set(status)):
        s = status.get(dest)
        rows.append([dest, str(s.in_flight if s else 0), f"{s.delivered_per_second:.1f}" if s else "0.0", str(s.waiting if s else 0),
                     "; ".join(limits.get(dest, [])) or "-", effects.get(dest, "-")])
    print_table(rows, ["DESTINATION", "IN FLIGHT", "DELIVERED/S", "WAITING", "LIMITS", "EFFECT"])


def cmd_site(c: Any, a: argparse.Namespace) -> None:
    r = c.admin.SetSite(admin_pb2.SetSiteRequest(site=shaping_pb2.Site(name=a.name, domains=a.domains))).site
    print(f"site {r.name}: {', '.join(r.domains)}")


def cmd_drop_site(c: Any, a: argparse.Namespace) -> None:
    print("deleted" if c.admin.DeleteSite(admin_pb2.DeleteSiteRequest(name=a.name)).deleted else "no such site")


def cmd_rule(c: Any, a: argparse.Namespace) -> None:
    rule = shaping_pb2.ShapingRule(rule_id=a.rule_id, pattern=a.pattern, threshold=a.threshold, window=duration(a.window),
                                   duration=duration(a.lifetime),
                                   action=shaping_pb2.SHAPING_ACTION_SLOW if a.slow else shaping_pb2.SHAPING_ACTION_SUSPEND)
    if a.slow:
        rule.floor.CopyFrom(a.slow)
    r = c.admin.SetShapingRule(admin_pb2.SetShapingRuleRequest(rule=rule)).rule
    print(f"rule {r.rule_id}: {r.threshold} x /{r.pattern}/ in {r.window.ToTimedelta()} -> "
          f"{'slow to ' + rate_text(r.floor) if a.slow else 'suspend'} for {r.duration.ToTimedelta()}")


def cmd_drop_rule(c: Any, a: argparse.Namespace) -> None:
    print("deleted" if c.admin.DeleteShapingRule(admin_pb2.DeleteShapingRuleRequest(rule_id=a.rule_id)).deleted else "no such rule")


def cmd_resume(c: Any, a: argparse.Namespace) -> None:
    lifted = c.admin.LiftEffect(admin_pb2.LiftEffectRequest(destination=a.destination)).lifted
    print("effect lifted" if lifted else "no effect in force")


def register(sub: Any) -> None:
    t = sub.add_parser("throttle", help="traffic shaping per destination").add_subparsers(dest="action", required=True)
    s = t.add_parser("set", help="limit a destination (a recipient domain or a site)")
    s.add_argument("destination")
    s.add_argument("--queue", type=queue_option, help="only this queue (default: every queue)")
    s.add_argument("--rate", type=rate_arg, help="deliveries per period: 20/s, 600/m, 10000/d")
    s.add_argument("--concurrency", type=whole(1), help="deliveries handed out and unanswered at most")
    s.set_defaults(fn=cmd_set)
    s = t.add_parser("clear", help="remove a destination's limits")
    s.add_argument("destination")
    s.add_argument("--queue", type=queue_option)
    s.set_defaults(fn=cmd_clear)
    s = t.add_parser("list", help="throttles, effects in force (and when they end), rules, sites")
    s.add_argument("--queue", type=queue_option)
    s.set_defaults(fn=cmd_list)
    s = t.add_parser("resume", help="end the effect in force on a destination now")
    s.add_argument("destination")
    s.set_defaults(fn=cmd_resume)
    s = t.add_parser("site", help="group domains into one destination")
    s.add_argument("name")
    s.add_argument("domains", nargs="+")
    s.set_defaults(fn=cmd_site)
    s = t.add_parser("drop-site", help="remove a site (its domains are destinations of their own again)")
    s.add_argument("name")
    s.set_defaults(fn=cmd_drop_site)
    s = t.add_parser("rule", help="react to RETRY errors: suspend or slow a destination")
    s.add_argument("rule_id")
    s.add_argument("--pattern", required=True, help="regular expression searched in RETRY error messages")
    s.add_argument("--threshold", type=whole(1), default=3)
    s.add_argument("--window", type=duration_arg, default=dt.timedelta(minutes=5))
    how = s.add_mutually_exclusive_group(required=True)
    how.add_argument("--suspend", action="store_true")
    how.add_argument("--slow", type=rate_arg, metavar="FLOOR", help="drop to this rate, then ramp back up")
    s.add_argument("--for", dest="lifetime", type=duration_arg, default=dt.timedelta(minutes=10))
    s.set_defaults(fn=cmd_rule)
    s = t.add_parser("drop-rule", help="remove an automatic rule (its effects in force run to their end)")
    s.add_argument("rule_id")
    s.set_defaults(fn=cmd_drop_rule)
