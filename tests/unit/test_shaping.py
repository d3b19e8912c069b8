"""Traffic shaping's pure rules (services/domain/shaping.py) and one process's admission
(services/app/shaper.py) fed snapshots directly: no store, no broker."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
import uuid

import pytest

from services.app import shaper as shaper_mod
from services.app.shaper import Shaper, Ticket, Wait
from services.domain import model, shaping
from services.domain.errors import InvalidArgument

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)


def mail(*recipients: str) -> model.QueuedMail:
    m = model.Mail(name="m", sender="a@b.c", recipients=tuple(recipients))
    return model.QueuedMail(queue="q", enqueue_id=uuid.uuid4(), enqueued_at=NOW, slice_start=NOW, bucket=0, mail=m,
                            blob_ids=(), size=1)


@pytest.mark.parametrize("text,count,per", [("20/s", 20, "s"), ("600/min", 600, "m"), ("10000/day", 10000, "d"), (" 5 / h ", 5, "h")])
def test_rates_parse(text, count, per):
    assert shaping.parse_rate(text) == shaping.Rate(count, per)


@pytest.mark.parametrize("text", ["20", "0/s", "-1/s", "5/week", "1/s/s", "2000000/s"])
def test_bad_rates_are_refused(text):
    with pytest.raises(InvalidArgument):
        shaping.parse_rate(text)


def test_throttle_validation():
    t = shaping.validate_throttle(shaping.Throttle("Example.COM.", "", shaping.Rate(5), None))
    assert t.destination == "example.com"
    for bad in (shaping.Throttle("example.com"), shaping.Throttle("a..b", rate=shaping.Rate(1)),
                shaping.Throttle("x@y", rate=shaping.Rate(1)), shaping.Throttle("ok.com", concurrency=0),
                shaping.Throttle("ok.com", queue="bad queue!", concurrency=1)):
        with pytest.raises(InvalidArgument):
            shaping.validate_throttle(bad)


def test_rule_validation():
    ok = shaping.AutoRule("r", r"421 .*rate", 3, dt.timedelta(minutes=5), "slow", dt.timedelta(minutes=10), shaping.Rate(1))
    assert shaping.validate_rule(ok) == ok
    for change in ({"pattern": "("}, {"pattern": "a{4294967295}"}, {"pattern": "(" * 101 + ")" * 101},
                   {"threshold": 0}, {"window": dt.timedelta(days=2)}, {"action": "bounce"},
                   {"duration": dt.timedelta(0)}, {"floor": None}):
        with pytest.raises(InvalidArgument):
            shaping.validate_rule(shaping.AutoRule(**{**ok.__dict__, **change}))


@pytest.mark.parametrize("pattern, why", [
    (r"(a+)+$", "a repeat inside a repeat"),
    (r".*a.*b", "more than one long repeat"),
    (r"\s*\s*x", "more than one long repeat"),
    (r"(?:rate|limit)+x", "alternatives inside a repeat"),
    (r"(a+){3}", "more than one long repeat"),
    (r".*a.*$", "more than one long repeat"),  # a repeat before $ can fail: not free
    (r"(?:a|aa){18}b", "alternatives inside a repeat"),  # 9 s on 1000 a's before
    (r"(?:a?){16}b", "too many repeats"),  # 2 s
    (r"(?:\d{0,9}){1000}x", "too many repeats"),
    (r"(a)\1", "a back-reference"),
    (r"\d{1,9}" * 5, "too many repeats"),
    (r"(?:a?a?)*b", "an optional part inside a repeat"),  # passed, and each a more multiplied the work by 2.4
])
def test_a_pattern_that_could_backtrack_for_seconds_is_refused(pattern, why):
    """dequeue_svc searches every RETRY error text (a remote server writes it) with the pattern,
    on its event loop: (a+)+$ over 40 characters would stall it for days."""
    ok = shaping.AutoRule("r", "421", 3, dt.timedelta(minutes=5), "suspend", dt.timedelta(minutes=10))
    with pytest.raises(InvalidArgument, match=re.escape(why)):
        shaping.validate_rule(dataclasses.replace(ok, pattern=pattern))
    # One stored before such patterns were refused matches nothing, rather than run
    assert not dataclasses.replace(ok, pattern=pattern).matches("a" * 22)


@pytest.mark.parametrize("pattern", [r"421 4\.7\.0 .*rate limited", r"^452 ", r"(rate|limit) exceeded",
                                     r"\d{3}\.\d{1,3}\.\d{1,3}", r"(?:ab)*c", r"too many.*connections",
                                     r".*rate limit.*", r"\s+4\.7\.0\s+", r"421[- ]4\.7\.[0-9]+ .*",
                                     r"[0-9a-f]{8}-[0-9a-f]{4}", r"(\d{1,3}\.){3}\d{1,3}"])
def test_common_patterns_pass(pattern):
    ok = shaping.AutoRule("r", pattern, 3, dt.timedelta(minutes=5), "suspend", dt.timedelta(minutes=10))
    assert shaping.validate_rule(ok).pattern == pattern


def test_destinations_group_domains_into_sites():
    sites = shaping.site_of([shaping.Site("gmail", ("gmail.com", "googlemail.com"))])
    assert shaping.destinations(["a@Gmail.com", "b@googlemail.com", "c@other.org."], sites) == ("gmail", "other.org")
    assert shaping.destinations([], sites) == ()


@pytest.mark.parametrize("limit", [1, 2, 5, 7, 20])
@pytest.mark.parametrize("members", [1, 2, 3, 4])
def test_concurrency_parts_add_up_to_the_limit(limit, members):
    parts = [shaping.concurrency_share(limit, i, members) for i in range(members)]
    assert sum(parts) == limit and max(parts) - min(parts) <= 1


def test_stamp_is_stable_and_changes_with_members_or_rates():
    a = shaping.stamp(["m2", "m1"], [(("", "x.com"), 20.0)])
    assert a == shaping.stamp(["m1", "m2"], [(("", "x.com"), 20.0)])
    assert a != shaping.stamp(["m1"], [(("", "x.com"), 20.0)])
    assert a != shaping.stamp(["m1", "m2"], [(("", "x.com"), 10.0)])


def test_grid_spaces_slots_and_never_reserves_in_the_past():
    g = shaping.Grid(0.5)
    assert [g.reserve(100.0) for _ in range(3)] == [100.0, 100.5, 101.0]
    assert g.reserve(200.0) == 200.0


def test_slow_effect_ramps_from_floor_to_the_throttle():
    e = shaping.Effect("x.com", "r", "slow", NOW, NOW + dt.timedelta(seconds=100), shaping.Rate(2))
    throttle = shaping.Rate(12)
    rates = [shaping.effect_rate(e, throttle, NOW + dt.timedelta(seconds=s)).per_second for s in (0, 25, 50, 99)]
    assert rates[0] == pytest.approx(2) and rates == sorted(rates) and rates[-1] < 12
    assert shaping.effect_rate(e, throttle, NOW + dt.timedelta(seconds=100)) is None
    assert shaping.effect_rate(e, None, NOW + dt.timedelta(seconds=99)) == shaping.Rate(2)


def test_suspension_covers_its_destinations_until_it_ends():
    e = shaping.Effect("x.com", "r", "suspend", NOW, NOW + dt.timedelta(seconds=30))
    assert shaping.suspended_until([e], ("x.com", "y.com"), NOW) == e.ends_at
    assert shaping.suspended_until([e], ("y.com",), NOW) is None
    assert shaping.suspended_until([e], ("x.com",), e.ends_at) is None


def test_status_sums_the_members_reports():
    s = shaping.status({"a": {"x": {"in_flight": 2, "delivered_per_s": 1.5, "waiting": 3}},
                        "b": {"x": {"in_flight": 1, "delivered_per_s": 0.5, "waiting": 0}}})
    assert s == [shaping.DestinationStatus("x", 3, 2.0, 3)]


# --- one process's admission ----------------------------------------------------------------


def joined(snap: shaping.Snapshot, me: str = "m1") -> Shaper:
    s = Shaper(store=None, member=me)  # type: ignore[arg-type]  # no store: refresh() is not called
    s._consumers = 1
    s.apply(snap)
    s._seen_since = time.monotonic() - shaping.JOIN_AFTER_S - 1
    return s


def members(*ids: str) -> dict:
    return {i: {} for i in ids}


def test_no_limit_costs_nothing_and_hands_out():
    s = joined(shaping.Snapshot(members=members("m1")))
    assert not s.active and s.admit("q", mail("a@x.com"), None, NOW) is None


def test_a_joining_member_waits_before_taking_a_share():
    s = joined(shaping.Snapshot(throttles=(shaping.Throttle("x.com", concurrency=5),), members=members("m1")))
    s._seen_since = time.monotonic()
    w = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(w, Wait) and w.reason == "joining"


def test_rate_is_split_among_members_and_waits_carry_a_reservation():
    snap = shaping.Snapshot(throttles=(shaping.Throttle("x.com", rate=shaping.Rate(10)),), members=members("m1", "m2"))
    s = joined(snap)
    first = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(first, Ticket)
    second = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(second, Wait) and second.reason == "rate"
    assert second.delay == dt.timedelta(seconds=0.2)  # 10/s over two members: 5/s each
    assert second.reservation is not None
    # Arriving at its slot with the same stamp: handed out without reserving again.
    later = NOW + dt.timedelta(seconds=0.25)
    assert isinstance(s.admit("q", mail("a@x.com"), second.reservation, later), Ticket)
    # Another destination is not held back by x.com's backlog.
    assert s.admit("q", mail("a@y.com"), None, NOW) is None


def test_a_reservation_made_under_other_members_is_made_again():
    snap = shaping.Snapshot(throttles=(shaping.Throttle("x.com", rate=shaping.Rate(10)),), members=members("m1", "m2"))
    s = joined(snap)
    s.admit("q", mail("a@x.com"), None, NOW)
    w = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(w, Wait)
    s.apply(shaping.Snapshot(throttles=snap.throttles, members=members("m1")))  # m2 left
    again = s.admit("q", mail("a@x.com"), w.reservation, NOW + dt.timedelta(seconds=0.25))
    assert isinstance(again, Ticket)  # a new grid (10/s alone) from now: its first slot is free


def test_concurrency_part_is_held_until_released():
    snap = shaping.Snapshot(throttles=(shaping.Throttle("x.com", concurrency=5),), members=members("m1", "m2", "m3"))
    s = joined(snap, "m3")  # the third of three: 5 = 2 + 2 + 1
    t = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(t, Ticket)
    w = s.admit("q", mail("a@x.com"), None, NOW)
    assert isinstance(w, Wait) and w.reason == "concurrency" and w.delay >= shaper_mod.delays.UNIT
    s.release(t)
    assert isinstance(s.admit("q", mail("a@x.com"), None, NOW), Ticket)


def test_queue_throttles_apply_to_their_queue_only():
    snap = shaping.Snapshot(throttles=(shaping.Throttle("x.com", "other", concurrency=1),), members=members("m1"))
    s = joined(snap)
    assert s.admit("q", mail("a@x.com"), None, NOW) is None


def test_suspended_destination_waits_to_the_end_of_the_effect():
    e = shaping.Effect("x.com", "r", "suspend", NOW, NOW + dt.timedelta(seconds=30))
    s = joined(shaping.Snapshot(effects=(e,), members=members("m1")))
    w = s.admit("q", mail("a@x.com", "b@y.com"), None, NOW)
    assert isinstance(w, Wait) and w.reason == "suspended" and w.delay == dt.timedelta(seconds=30)


def test_a_wait_beyond_the_ladder_is_taken_in_parts_keeping_its_slot():
    snap = shaping.Snapshot(throttles=(shaping.Throttle("x.com", rate=shaping.Rate(1, "d")),), members=members("m1"))
    s = joined(snap)
    waits = [s.admit("q", mail("a@x.com"), None, NOW) for _ in range(400)]
    last = waits[-1]
    assert isinstance(last, Wait) and last.delay == shaper_mod.MAX_WAIT  # its slot is 399 days ahead
    slot = dt.datetime.fromtimestamp(last.reservation[0] / 1000, dt.timezone.utc)
    assert slot - NOW == dt.timedelta(days=399)
    back = s.admit("q", mail("a@x.com"), last.reservation, NOW + shaper_mod.MAX_WAIT)
    assert isinstance(back, Wait) and back.reservation == last.reservation  # not reserved again
    assert back.delay == dt.timedelta(days=399) - shaper_mod.MAX_WAIT
    assert isinstance(s.admit("q", mail("a@x.com"), last.reservation, slot), Ticket)
