"""Traffic shaping per destination: the values and the pure rules (no I/O).

- A **destination** is a recipient domain, or a site an operator names that groups domains
  (``gmail.com, googlemail.com`` are one site). A mail whose recipients span several destinations
  takes room in each of them (the consumer delivers one mail to all its recipients at once), so it
  waits for the strictest: one Enqueue stays one mail.
- A **throttle** limits a destination, for one queue or for every queue (queue ""), by **rate**
  (deliveries per second, minute, hour or day) and/or **concurrency** (deliveries handed out and
  not yet answered). A mail is held to every throttle that applies to it.
- An **automatic rule** names a pattern of the consumer's RETRY error messages, a threshold in a
  window, and an action: **suspend** the destination for a duration, or **slow** it to a floor
  rate that ramps back up to its throttle over the duration. A firing is an **effect**.

The limits are shared by the dequeue replicas that consume (the **members**) by splitting them:
each member has ``rate / members`` and its part of the concurrency (services/app/shaper.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
import re._constants as sre
import re._parser as sre_parse
import zlib
from collections.abc import Iterable

from services.domain.errors import InvalidArgument
from services.domain.validation import queue_name, shown

PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
ACTIONS = ("suspend", "slow")
#: Slow effects ramp back up in this many steps (each step is a new rate the members agree on).
RAMP_STEPS = 5
MAX_RULE_WINDOW = dt.timedelta(days=1)
MAX_EFFECT = dt.timedelta(days=7)
#: How often a dequeue member reads the shaping state and writes its heartbeat; a change reaches
#: every member within this (plus the read).
REFRESH_S = 1.0
#: A member whose heartbeat is older than this has left (killed): the others take its share.
MEMBER_TTL_S = 3
#: A new member takes a share only once every other member has had time to see it.
JOIN_AFTER_S = 1.5 * REFRESH_S
#: The longest pattern a shaping rule takes (it is matched against every RETRY's error message,
#: and carried in its SHAPING_CHANGED event): a rule's other texts are bounded alike.
MAX_PATTERN = 1000
#: Groups in a pattern at most: hundreds nested would exhaust the regex compiler's recursion.
MAX_GROUPS = 100
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$")


@dataclasses.dataclass(frozen=True)
class Rate:
    count: int
    per: str = "s"  # s, m, h, d

    @property
    def per_second(self) -> float:
        return self.count / PERIODS[self.per]

    def __str__(self) -> str:
        return f"{self.count}/{self.per}"


@dataclasses.dataclass(frozen=True)
class Throttle:
    destination: str
    queue: str = ""  # "": every queue
    rate: Rate | None = None
    concurrency: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.queue, self.destination)


@dataclasses.dataclass(frozen=True)
class Site:
    name: str
    domains: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class AutoRule:
    rule_id: str
    pattern: str
    threshold: int
    window: dt.timedelta
    action: str
    duration: dt.timedelta
    floor: Rate | None = None

    def matches(self, error: str) -> bool:
        return _searchable(self.pattern) and re.search(self.pattern, error) is not None


@functools.lru_cache(maxsize=256)
def _searchable(pattern: str) -> bool:
    """False for a stored pattern that could backtrack for seconds (``backtracking``; stored before
    such patterns were refused): it matches nothing rather than stall the delivering process."""
    try:
        return backtracking(pattern) is None
    except (re.error, OverflowError, RecursionError):
        return False


@dataclasses.dataclass(frozen=True)
class Effect:
    destination: str
    rule_id: str
    action: str
    started_at: dt.datetime
    ends_at: dt.datetime
    floor: Rate | None = None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Everything shaping reads, as of one read."""

    throttles: tuple[Throttle, ...] = ()
    sites: tuple[Site, ...] = ()
    rules: tuple[AutoRule, ...] = ()
    effects: tuple[Effect, ...] = ()
    #: member id -> its last heartbeat's statistics (destination -> {in_flight, delivered_per_s, waiting}).
    members: dict[str, dict[str, dict[str, float]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DestinationStatus:
    """One destination as the members report it (summed)."""

    destination: str
    in_flight: float = 0
    delivered_per_s: float = 0.0
    waiting: float = 0


def status(members: dict[str, dict[str, dict[str, float]]]) -> list[DestinationStatus]:
    """The members' heartbeat statistics summed per destination."""
    sums: dict[str, dict[str, float]] = {}
    for stats in members.values():
        for dest, entry in stats.items():
            total = sums.setdefault(dest, {"in_flight": 0, "delivered_per_s": 0.0, "waiting": 0})
            for k in total:
                total[k] += float(entry.get(k, 0))
    return [DestinationStatus(d, v["in_flight"], round(v["delivered_per_s"], 3), v["waiting"]) for d, v in sorted(sums.items())]


def applying_to(throttles: Iterable[Throttle], queue: str) -> list[Throttle]:
    """The throttles a queue's mails are held to (its own and every queue's), by destination."""
    return sorted((t for t in throttles if t.queue in ("", queue)), key=lambda t: (t.destination, t.queue))


# --- parsing and validation ------------------------------------------------------------------


def parse_rate(text: str) -> Rate:
    """``20/s``, ``600/m``, ``10000/day``, ``5/hour``: a count per period."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*", text.lower())
    if not m:
        raise InvalidArgument(f"rate {shown(text)} is not COUNT/PERIOD (period: s, m, h or d; e.g. 20/s, 10000/d)")
    return validate_rate(Rate(int(m.group(1)), m.group(2)[0]), "rate")


def validate_rate(rate: Rate, field: str) -> Rate:
    if rate.per not in PERIODS:
        raise InvalidArgument(f"{field}.per must be SECOND, MINUTE, HOUR or DAY")
    if not 1 <= rate.count <= 1_000_000:
        raise InvalidArgument(f"{field}.count must be between 1 and 1000000, not {rate.count}")
    return rate


def destination_name(name: str, field: str = "destination") -> str:
    """A domain or site name, lower-cased; InvalidArgument otherwise."""
    lowered = name.strip().lower().rstrip(".")
    if not lowered or len(lowered) > 253 or not _NAME.fullmatch(lowered):
        raise InvalidArgument(f"{field} {shown(name)} is not a domain or site name (letters, digits, '-' and '.')")
    return lowered


def validate_throttle(t: Throttle) -> Throttle:
    if t.queue:
        queue_name(t.queue)
    if t.rate is None and t.concurrency is None:
        raise InvalidArgument("a throttle needs a rate, a concurrency or both")
    if t.concurrency is not None and not 1 <= t.concurrency <= 100_000:
        raise InvalidArgument(f"concurrency must be between 1 and 100000, not {t.concurrency}")
    rate = validate_rate(t.rate, "rate") if t.rate is not None else None
    return Throttle(destination_name(t.destination), t.queue, rate, t.concurrency)


def validate_site(s: Site) -> Site:
    if not s.domains:
        raise InvalidArgument("a site needs at least one domain")
    domains = tuple(sorted({destination_name(d, "domain") for d in s.domains}))
    return Site(destination_name(s.name, "site name"), domains)


def validate_rule(r: AutoRule) -> AutoRule:
    if not r.pattern:
        raise InvalidArgument("a shaping rule needs a pattern of RETRY error messages")
    if len(r.pattern) > MAX_PATTERN:
        raise InvalidArgument(f"pattern is {len(r.pattern)} characters long: at most {MAX_PATTERN}")
    if r.pattern.count("(") > MAX_GROUPS:  # Python's compiler recurses per nesting level
        raise InvalidArgument(f"pattern has {r.pattern.count('(')} groups: at most {MAX_GROUPS}")
    try:
        re.compile(r.pattern)
        slow = backtracking(r.pattern)
    except (re.error, OverflowError, RecursionError) as e:  # OverflowError: a{4294967295}
        raise InvalidArgument(f"pattern {shown(r.pattern)} is not a regular expression: {e}") from None
    if slow is not None:
        raise InvalidArgument(
            f"pattern {shown(r.pattern)} could take seconds on one error message ({slow}): dequeue_svc matches "
            "every RETRY's error text, which a remote server writes. Use at most one long repeat (*, +, {n,}; "
            "a trailing .* is free), bounded ones elsewhere (\\d{1,3}), none inside another, and no alternatives "
            "(ab|cd) inside a repeat; a pattern is searched anywhere in the text, so it needs no leading .*")
    if not 1 <= r.threshold <= 100_000:
        raise InvalidArgument(f"threshold must be between 1 and 100000, not {r.threshold}")
    if not dt.timedelta(seconds=1) <= r.window <= MAX_RULE_WINDOW:
        raise InvalidArgument(f"window must be between 1s and {MAX_RULE_WINDOW}")
    if r.action not in ACTIONS:
        raise InvalidArgument("action must be SUSPEND or SLOW")
    if not dt.timedelta(seconds=1) <= r.duration <= MAX_EFFECT:
        raise InvalidArgument(f"duration must be between 1s and {MAX_EFFECT}")
    if r.action == "slow" and r.floor is None:
        raise InvalidArgument("a SLOW rule needs a floor rate")
    floor = validate_rate(r.floor, "floor") if r.floor is not None and r.action == "slow" else None
    return dataclasses.replace(r, floor=floor)


#: A repeat of more than this many is "long": its cost grows with the text's length.
SHORT_REPEAT = 16
#: Short repeats multiply the tries at each position by at most this much, together.
MAX_SHORT_TRIES = 1024


def backtracking(pattern: str) -> str | None:
    """Why ``pattern`` could backtrack for seconds on a 1000-character text (Python's engine
    backtracks), or None. Refused: a repeat inside a repeat ((a+)+, exponential), alternatives
    inside a repeat ((ab|a)*, exponential), back-references, and more than one long repeat
    (.*a.*b searched in 1000 characters without a match takes about 0.3 s: cubic), not counting
    a one-character repeat that ends the pattern (.*rate limit.* : nothing can fail after it). One
    long repeat costs at most the square of the text (about 1 ms). A fixed count ({8}) chooses
    nothing itself, but what its body may choose counts once per time."""
    long_repeats = 0
    short_tries = 1

    def walk(items: object, repeated: bool, fixed: bool = False) -> str | None:
        """``repeated``: inside a repeat of a varying count; ``fixed``: inside a fixed count ({8}),
        which chooses nothing itself but multiplies what its body may choose."""
        nonlocal long_repeats, short_tries
        for op, av in items:  # type: ignore[attr-defined]
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT) and av[0] == av[1]:
                for _ in range(av[1]):  # its body counted that many times (stops at the first refusal)
                    why = walk(av[2], repeated, fixed or av[1] > 1)
                    if why is not None:
                        return why
                continue
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, body = av
                if high > 1 and repeated:
                    return "a repeat inside a repeat"
                if repeated and low != high:  # (?:a?a?)*: each optional part a choice per turn, as alternatives
                    return "an optional part inside a repeat"
                if high > SHORT_REPEAT:
                    long_repeats += 1
                    if long_repeats > 1:
                        return "more than one long repeat"
                else:
                    short_tries *= high - low + 1
                    if short_tries > MAX_SHORT_TRIES:
                        return "too many repeats"
                why = walk(body, repeated or high > 1, fixed)
            elif op is sre.BRANCH:
                if repeated or fixed:
                    return "alternatives inside a repeat"
                why = next((w for w in (walk(alt, repeated, fixed) for alt in av[1]) if w), None)
            elif op is sre.SUBPATTERN:
                why = walk(av[-1], repeated, fixed)
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                why = walk(av[1], repeated, fixed)
            elif op is sre.ATOMIC_GROUP:
                why = walk(av, repeated, fixed)
            elif op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
                return "a back-reference"
            else:
                why = None
            if why is not None:
                return why
        return None

    items = list(sre_parse.parse(pattern))
    if items and items[-1][0] in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT) and _one_char(items[-1][1][2]):
        # A trailing .* (\s+, [0-9]*), the very last item, never fails once what comes before
        # matched: it adds no tries (followed by $ or \b it could fail, and counts).
        del items[-1]
    return walk(items, False)


def _one_char(body: object) -> bool:
    """Whether a repeat's body matches one character (., a class, a literal)."""
    items = list(body)  # type: ignore[call-overload]
    return len(items) == 1 and items[0][0] in (sre.ANY, sre.IN, sre.LITERAL, sre.NOT_LITERAL, sre.CATEGORY)


# --- destinations ----------------------------------------------------------------------------


def site_of(sites: Iterable[Site]) -> dict[str, str]:
    """domain -> site name."""
    return {d: s.name for s in sites for d in s.domains}


def destinations(recipients: Iterable[str], sites: dict[str, str]) -> tuple[str, ...]:
    """The destinations of a mail's recipients (sorted, each once)."""
    found = set()
    for r in recipients:
        domain = r.rsplit("@", 1)[-1].strip().lower().rstrip(".")
        if domain:
            found.add(sites.get(domain, domain))
    return tuple(sorted(found))


# --- effects ---------------------------------------------------------------------------------


def effect_rate(effect: Effect, throttle_rate: Rate | None, now: dt.datetime) -> Rate | None:
    """A SLOW effect's rate now: its floor, then RAMP_STEPS steps up to the throttle's rate (a
    destination with no rate limit stays at the floor until the effect ends)."""
    if effect.action != "slow" or effect.floor is None or now >= effect.ends_at:
        return None
    if throttle_rate is None or throttle_rate.per_second <= effect.floor.per_second:
        return effect.floor
    span = (effect.ends_at - effect.started_at).total_seconds()
    step = min(RAMP_STEPS - 1, int((now - effect.started_at).total_seconds() / span * RAMP_STEPS)) if span > 0 else 0
    per_s = effect.floor.per_second + (throttle_rate.per_second - effect.floor.per_second) * step / RAMP_STEPS
    # Expressed per day so that a fraction of a per-second rate stays exact enough.
    return Rate(max(1, round(per_s * 86400)), "d")


def suspended_until(effects: Iterable[Effect], dests: Iterable[str], now: dt.datetime) -> dt.datetime | None:
    wanted = set(dests)
    ends = [e.ends_at for e in effects if e.action == "suspend" and e.destination in wanted and e.ends_at > now]
    return max(ends) if ends else None


# --- sharing among members --------------------------------------------------------------------


def member_index(members: Iterable[str], me: str) -> tuple[int, int] | None:
    """(my index, how many) among the members sorted by id; None when I am not one of them."""
    ordered = sorted(members)
    return (ordered.index(me), len(ordered)) if me in ordered else None


def concurrency_share(limit: int, index: int, count: int) -> int:
    """My part of a concurrency limit: the parts of every member add up to the limit."""
    return limit // count + (1 if index < limit % count else 0)


def stamp(members: Iterable[str], rates: Iterable[tuple[object, float]]) -> int:
    """What a rate reservation was made under (the members and the rates): a reservation made
    under another stamp is not honoured (the grid it was made on no longer exists). Stable across
    processes (crc32, not hash())."""
    text = repr((sorted(members), sorted((repr(k), round(r, 6)) for k, r in rates)))
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


@dataclasses.dataclass
class Grid:
    """One member's slots for one limit: every ``spacing`` seconds, never in the past."""

    spacing: float
    next_free: float = 0.0

    def reserve(self, now: float) -> float:
        slot = max(now, self.next_free)
        self.next_free = slot + self.spacing
        return slot
