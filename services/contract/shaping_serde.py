"""Traffic shaping's protobuf <-> domain translation (mailqueue/v1/shaping.proto)."""

from __future__ import annotations

import datetime as dt

from mailqueue.v1 import shaping_pb2
from services.contract.serde import duration_from_proto, duration_to_proto, timestamp_to_proto
from services.domain import shaping
from services.domain.errors import InvalidArgument

_PERIODS = {shaping_pb2.RATE_PERIOD_SECOND: "s", shaping_pb2.RATE_PERIOD_MINUTE: "m",
            shaping_pb2.RATE_PERIOD_HOUR: "h", shaping_pb2.RATE_PERIOD_DAY: "d"}
_PERIODS_PB = {v: k for k, v in _PERIODS.items()}
_ACTIONS = {shaping_pb2.SHAPING_ACTION_SUSPEND: "suspend", shaping_pb2.SHAPING_ACTION_SLOW: "slow"}
_ACTIONS_PB = {v: k for k, v in _ACTIONS.items()}


def rate_to_proto(r: shaping.Rate) -> shaping_pb2.Rate:
    return shaping_pb2.Rate(count=r.count, per=_PERIODS_PB[r.per])


def rate_from_proto(pb: shaping_pb2.Rate, field: str) -> shaping.Rate:
    if pb.per not in _PERIODS:
        raise InvalidArgument(f"{field}.per must be SECOND, MINUTE, HOUR or DAY")
    return shaping.validate_rate(shaping.Rate(min(pb.count, 2**31), _PERIODS[pb.per]), field)


def throttle_to_proto(t: shaping.Throttle) -> shaping_pb2.Throttle:
    pb = shaping_pb2.Throttle(destination=t.destination, queue=t.queue, concurrency=t.concurrency or 0)
    if t.rate is not None:
        pb.rate.CopyFrom(rate_to_proto(t.rate))
    return pb


def throttle_from_proto(pb: shaping_pb2.Throttle) -> shaping.Throttle:
    rate = rate_from_proto(pb.rate, "throttle.rate") if pb.HasField("rate") else None
    return shaping.validate_throttle(shaping.Throttle(pb.destination, pb.queue, rate, pb.concurrency or None))


def site_to_proto(s: shaping.Site) -> shaping_pb2.Site:
    return shaping_pb2.Site(name=s.name, domains=list(s.domains))


def site_from_proto(pb: shaping_pb2.Site) -> shaping.Site:
    return shaping.validate_site(shaping.Site(pb.name, tuple(pb.domains)))


def rule_to_proto(r: shaping.AutoRule) -> shaping_pb2.ShapingRule:
    pb = shaping_pb2.ShapingRule(rule_id=r.rule_id, pattern=r.pattern, threshold=r.threshold, action=_ACTIONS_PB[r.action],
                                 window=duration_to_proto(r.window), duration=duration_to_proto(r.duration))
    if r.floor is not None:
        pb.floor.CopyFrom(rate_to_proto(r.floor))
    return pb


def rule_from_proto(pb: shaping_pb2.ShapingRule) -> shaping.AutoRule:
    if pb.action not in _ACTIONS:
        raise InvalidArgument("rule.action must be SUSPEND or SLOW")
    rule_id = shaping.destination_name(pb.rule_id, "rule_id")
    floor = rate_from_proto(pb.floor, "rule.floor") if pb.HasField("floor") else None
    return shaping.validate_rule(shaping.AutoRule(
        rule_id, pb.pattern, pb.threshold, duration_from_proto(pb.window, "rule.window", dt.timedelta(days=2)),
        _ACTIONS[pb.action], duration_from_proto(pb.duration, "rule.duration", dt.timedelta(days=8)), floor))


def effect_to_proto(e: shaping.Effect, current: shaping.Rate | None) -> shaping_pb2.ShapingEffect:
    pb = shaping_pb2.ShapingEffect(destination=e.destination, rule_id=e.rule_id, action=_ACTIONS_PB[e.action],
                                   started_at=timestamp_to_proto(e.started_at), ends_at=timestamp_to_proto(e.ends_at))
    if current is not None:
        pb.current_rate.CopyFrom(rate_to_proto(current))
    return pb


def status_to_proto(s: shaping.DestinationStatus) -> shaping_pb2.DestinationStatus:
    return shaping_pb2.DestinationStatus(destination=s.destination, in_flight=int(s.in_flight),
                                         delivered_per_second=s.delivered_per_s, waiting=int(s.waiting))
