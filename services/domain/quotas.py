"""Enqueue quotas: who may queue how much (issue #50). The values and the pure rules (no I/O).

- A quota limits a **subject**: a ``tenant`` (the name access control gives the caller:
  services/runtime/auth.py), a ``sender`` (an address), a ``sender_domain``, or a ``queue``.
- **Rates** in mails/s and bytes/s, each with a **burst** (how many mails, how many bytes may
  come at once above the rate), enforced by GCRA (the generic cell rate algorithm: one
  "theoretical arrival time" per limit, no timer, no window edges).
- **Depth** limits (queues only): a queue holding ``max_queued_mails`` mails or more, or
  ``max_queued_bytes`` content bytes or more, refuses new mail, checked against the queue's
  counters (services/domain/counts.py: ``size`` and ``bytes``), never a scan.
- **Exemptions**: a quota may let bounces (the empty sender) and named senders through.

A mail is refused when any quota that applies to it would be exceeded; a refused mail takes
nothing from any quota. The decision says which quota and subject refused, and how long to wait.

Shared across enqueue replicas by splitting (services/app/quota_keeper.py): each live member
enforces its ``fraction`` of every rate (by the members' demand at the last refresh; ``rate / N``
when none asks) with the burst in proportion (at least one mail); the fractions add up to 1, so
N replicas together accept at most ``rate * t + burst + N - 1`` mails in any ``t`` (each part's
burst rounded up to one mail; bytes: plus one mail's size each), give or take a refresh while the
demand moves.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Mapping

from services.domain.errors import InvalidArgument, ResourceExhausted
from services.domain.validation import DOMAIN, address, queue_name, shown

KINDS = ("tenant", "sender", "sender_domain", "queue")
#: A mail waits at least this long when refused (a client's retry sooner would be refused again).
MIN_RETRY_S = 0.05
#: The smallest rate a quota may set (a mail or a byte in about 11.6 days).
MIN_RATE = 1e-6
#: A refusal for depth asks the client to come back after this long (the queue drains meanwhile).
DEPTH_RETRY_S = 5.0
#: The longest subject name (a tenant, address, domain or queue).
MAX_SUBJECT = 320
#: The longest tenant name.
MAX_TENANT = 255


@dataclasses.dataclass(frozen=True)
class Quota:
    """The limits of one subject. A limit left None does not apply; at least one is set."""

    kind: str
    subject: str
    mails_per_s: float | None = None
    #: Mails that may come at once above ``mails_per_s`` (at least 1).
    burst_mails: int = 1
    bytes_per_s: float | None = None
    #: Bytes that may come at once above ``bytes_per_s`` (at least the largest mail expected).
    burst_bytes: int = 0
    #: Queues only: no new mail while the queue holds this many.
    max_queued_mails: int | None = None
    #: Queues only: no new mail while the queue's mails hold this many content bytes.
    max_queued_bytes: int | None = None
    #: Bounces (empty sender) pass this quota.
    exempt_bounces: bool = False
    #: These senders pass this quota (exact addresses, lower case).
    exempt_senders: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)

    @property
    def has_depth(self) -> bool:
        """Whether a depth limit (mails or bytes) is set: the queue's counters are read for it."""
        return self.max_queued_mails is not None or self.max_queued_bytes is not None

    def exempts(self, sender: str) -> bool:
        if not sender:
            return self.exempt_bounces
        return sender.lower() in self.exempt_senders


def validate(q: Quota) -> Quota:
    """``q`` checked and normalized (subjects of senders and domains in lower case). Raises
    InvalidArgument naming the field and what is allowed."""
    if q.kind not in KINDS:
        raise InvalidArgument(f"quota kind {shown(q.kind)} is unknown: use one of {', '.join(KINDS)}")
    subject = subject_name(q.kind, q.subject)
    for name, rate in (("mails_per_s", q.mails_per_s), ("bytes_per_s", q.bytes_per_s)):
        if rate is not None and not MIN_RATE <= rate <= 1e12:  # a smaller one overflows the limiter's arithmetic
            raise InvalidArgument(f"{name} must be from {MIN_RATE:g} (one a day is 1.16e-05) to 1e12, or unset: {rate}")
    if q.mails_per_s is not None and q.burst_mails < 1:
        raise InvalidArgument(f"burst_mails must be at least 1 with a mail rate: {q.burst_mails}")
    if q.bytes_per_s is not None and q.burst_bytes < 1:
        raise InvalidArgument(f"burst_bytes must be at least 1 with a byte rate (at least the largest mail): {q.burst_bytes}")
    for name, depth in (("max_queued_mails", q.max_queued_mails), ("max_queued_bytes", q.max_queued_bytes)):
        if depth is None:
            continue
        if q.kind != "queue":
            raise InvalidArgument(f"{name} is a queue's limit: set it on a quota of kind queue")
        if depth < 1:
            raise InvalidArgument(f"{name} must be at least 1, or unset: {depth}")
    if q.mails_per_s is None and q.bytes_per_s is None and not q.has_depth:
        raise InvalidArgument("a quota needs a limit: mails_per_s, bytes_per_s, max_queued_mails or max_queued_bytes")
    senders = tuple(sorted({s.strip().lower() for s in q.exempt_senders}))
    for s in senders:  # as a mail's sender must be, or it could never match one
        if len(s) > MAX_SUBJECT:
            raise InvalidArgument(f"exempt sender {shown(s)} is not an address (local@domain)")
        address(s, "exempt sender")
    return dataclasses.replace(q, subject=subject, exempt_senders=senders)


def subject_name(kind: str, subject: str) -> str:
    """The subject of a quota of ``kind``, normalized; raises InvalidArgument."""
    if kind == "queue":
        return queue_name(subject)
    if kind == "sender_domain":
        d = subject.strip().lower()
        if not DOMAIN.fullmatch(d) or len(d) > 253:  # a name, or an address literal ([192.0.2.1]) as a sender's may be
            raise InvalidArgument(f"sender domain {shown(subject)} is not a domain name (e.g. example.com)")
        return d
    if kind == "sender":
        s = subject.strip().lower()
        local, at, domain = s.rpartition("@")
        if not at or not local or not DOMAIN.fullmatch(domain) or len(s) > MAX_SUBJECT:
            raise InvalidArgument(f"sender {shown(subject)} is not an address (local@domain)")
        return address(s, "sender")  # as a mail's sender must be, or it could never match one
    if kind == "tenant":
        if not is_tenant(subject):
            raise InvalidArgument(f"tenant {shown(subject)} is not a tenant name (up to 255 characters, a letter or digit first, "
                                  "then printable ones but a comma: no line break, no invisible character, no trailing space)")
        return subject
    raise InvalidArgument(f"quota kind {shown(kind)} is unknown: use one of {', '.join(KINDS)}")


def is_tenant(name: str) -> bool:
    """Whether ``name`` may name a tenant (in MAILQUEUE_TOKENS ``role@tenant:token``)."""
    # What a token names (``role@tenant``) or a client certificate's identity, a CN ("Relay Ops 1")
    # or a URI SAN as it is: a letter or digit first; then printable characters (str.isprintable:
    # no control, format, invisible, private-use or unassigned code point, no separator but the
    # ASCII space, so two names never look alike), no comma (settings are comma-separated lists),
    # no trailing space.
    return (0 < len(name) <= MAX_TENANT and name[0].isalnum() and name.isprintable() and "," not in name
            and not name.endswith(" "))


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a quota check knows of a mail before anything of it is written."""

    tenant: str
    sender: str
    queue: str
    #: Bytes known before writing (inline content, blob refs); 0 for a stream (charged after).
    size: int = 0

    def subjects(self) -> list[tuple[str, str]]:
        """The (kind, subject) keys that may limit this mail."""
        keys = [("queue", self.queue)]
        if self.tenant:
            keys.append(("tenant", self.tenant))
        if self.sender:
            sender = self.sender.lower()
            keys.append(("sender", sender))
            keys.append(("sender_domain", sender.rpartition("@")[2]))
        return keys


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a mail was refused: the quota (its kind and subject), which limit, how long to wait."""

    kind: str
    subject: str
    #: "mails_per_s", "bytes_per_s", "max_queued_mails" or "max_queued_bytes".
    limit: str
    retry_after_s: float
    description: str


#: The longest wait a refusal asks for.
MAX_RETRY_AFTER_S = 86_400.0


class QuotaExceeded(ResourceExhausted):
    """A quota or a queue's depth limit refuses the mail; ``refusal`` says which quota and how
    long to wait (sent as google.rpc RetryInfo and QuotaFailure details: services/runtime/status.py)."""

    def __init__(self, refusal: Refusal) -> None:
        # A client waits at most a day: a rate of a mail a century would otherwise ask it to wait
        # past what a Duration (and timedelta) can say.
        refusal = dataclasses.replace(refusal, retry_after_s=min(refusal.retry_after_s, MAX_RETRY_AFTER_S))
        self.refusal = refusal
        super().__init__(f"{refusal.description}: nothing was queued; retry after {refusal.retry_after_s:.2f} s")


class Gcra:
    """One rate limit: ``rate`` per second with a tolerance of ``burst`` above it (GCRA).

    State is one number, the theoretical arrival time ``tat``: a cost ``c`` may pass at ``now``
    when ``tat + c/rate - burst/rate <= now``; passing moves ``tat`` to ``max(tat, now) + c/rate``.
    Over any ``t`` it lets through at most ``rate * t + burst``.
    """

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tat = 0.0

    def wait(self, now: float, cost: float) -> float:
        """Seconds until ``cost`` may pass (0: now); nothing taken."""
        # In this order: an idle limiter (tat = now) and a cost of the whole burst give exactly 0;
        # now + c/r - b/r - now gave a few 1e-10 s in about 1 of 1,000 cases (the burst a member's
        # share of it), and such a chunk was refused "retry after 0.05 s".
        return max(0.0, (max(self.tat, now) - now) + (cost - self.burst) / self.rate)

    def take(self, now: float, cost: float) -> float:
        """Take ``cost`` (allowed or not: a stream's bytes are charged once streamed); the seconds
        it moved ``tat`` on, at the rate of now."""
        step = cost / self.rate
        self.tat = max(self.tat, now) + step
        return step

    def give_back(self, now: float, step: float) -> None:
        """Undo a ``take`` that moved ``tat`` on by ``step`` seconds (never to more than an idle
        limiter's credit). In seconds, not in cost: the rate of a member's share may have moved
        since (each refresh), and the same cost at another rate is another step."""
        self.tat = max(self.tat - step, now)

    def use(self, now: float, cost: float = 0.0) -> float:
        """The part of the burst in use now, 0 idle to 1 when the next ``cost`` (a mail: 1) would
        be refused: what an alert on it sees coming before refusals begin (out of the whole burst,
        a burst of 1 mail read 0.5 while it already refused)."""
        if self.wait(now, cost) > 0:
            return 1.0
        return min(1.0, max(0.0, self.tat - now) * self.rate / self.burst) if self.burst else 0.0


#: Of each rate, the part every member holds whatever its demand, split equally: a client that
#: starts sending through an idle member is served at once, before the next refresh shows its demand.
RESERVE = 0.1


def fraction(rate: float, demands: Mapping[str, float], member: str) -> float:
    """``member``'s fraction of ``rate`` among the members of ``demands`` (member -> mails, or
    bytes, a second it was asked for at the last refresh, refused ones included): RESERVE of the
    rate split equally, the rest max-min fair by demand (no member gets more than it asks while
    another asks for more than its even part), and what nobody asks for split equally. Every
    member computes the same fractions from the same heartbeats, and they add up to 1.

    So a tenant whose connections all reach one replica (gRPC keeps a connection, and a Service
    balances connections, not calls) is served its whole rate there, not ``rate / N``."""
    n = len(demands)
    if n <= 1 or rate <= 0:
        return 1.0 if n <= 1 else 1.0 / n
    left, given = rate * (1 - RESERVE), 0.0
    for i, (m, asked) in enumerate(sorted(demands.items(), key=lambda kv: (kv[1], kv[0]))):
        part = min(max(asked, 0.0), left / (n - i))
        left -= part
        if m == member:
            given = part
    return (given + left / n + rate * RESERVE / n) / rate


def split(quota: Quota, fractions: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """This member's part of ``quota``'s rates, given its fraction of each (``fraction``; "mails"
    and "bytes", 1 when absent): {"mails" or "bytes": (rate, burst)}, the burst in the rate's
    proportion and never below one mail (a mail's bytes pass an idle limiter whatever their
    number). Depth limits are not split: they are checked against the queue's shared counters."""
    out: dict[str, tuple[float, float]] = {}
    if quota.mails_per_s is not None:
        f = fractions.get("mails", 1.0)
        out["mails"] = (quota.mails_per_s * f, max(quota.burst_mails * f, 1.0))
    if quota.bytes_per_s is not None:
        f = fractions.get("bytes", 1.0)
        out["bytes"] = (quota.bytes_per_s * f, quota.burst_bytes * f)
    return out


def even(members: int) -> dict[str, float]:
    """Fractions of ``members`` members that split every rate evenly."""
    f = 1.0 / max(members, 1)
    return {"mails": f, "bytes": f}


def applying(quotas: dict[tuple[str, str], Quota], facts: Facts) -> list[Quota]:
    """The quotas that limit a mail of ``facts``: its subjects' quotas; one that exempts its sender
    only by its depth limits, if it has any."""
    found = [q for q in (quotas.get(k) for k in facts.subjects()) if q is not None]
    # An exemption lifts a quota's rates only: a queue's depth limits hold for every mail (a
    # producer chooses its envelope sender, and the depth limits keep the broker's disk).
    return [q if not q.exempts(facts.sender) else dataclasses.replace(q, mails_per_s=None, bytes_per_s=None)
            for q in found if not q.exempts(facts.sender) or q.has_depth]


@dataclasses.dataclass(frozen=True)
class Depth:
    """A queue's standing content as last read from its counters."""

    mails: int = 0
    bytes: int = 0


@dataclasses.dataclass(eq=False)
class Charge:
    """What one mail took from its quotas' rate limiters: given back, exactly that, if the mail is
    not enqueued after all (a refused mail, or a resend answered with its first send, takes nothing
    from a quota), whatever quotas were set or cleared meanwhile. A streamed mail's charge grows
    with its chunks, and names the stream to the quotas."""

    #: Each limiter taken from, and the seconds its take moved it on.
    taken: list[tuple[Gcra, float]] = dataclasses.field(default_factory=list)
    #: Its mail joined a group, which goes on whatever its caller does: kept even if the caller
    #: leaves (leaving must not be a way around a rate).
    committed: bool = False

    def take(self, limiter: Gcra, now: float, cost: float) -> None:
        """One entry per limiter, its steps added up: a stream of a million tiny (or empty) chunks
        held a million entries until it ended, memory a client chose without bound."""
        step = limiter.take(now, cost)
        for i, (taken, before) in enumerate(self.taken):
            if taken is limiter:
                self.taken[i] = (limiter, before + step)
                return
        self.taken.append((limiter, step))

    def give_back(self, now: float) -> None:
        """Undo every take of this charge (once)."""
        for limiter, step in self.taken:
            limiter.give_back(now, step)
        self.taken.clear()


def decide(
    quotas: list[Quota], limiters: dict[tuple[tuple[str, str], str], Gcra], depth: dict[str, Depth], facts: Facts,
    now: float, charge: Charge | None = None,
) -> Refusal | None:
    """None: every quota of ``quotas`` (those applying, see ``applying``) lets the mail pass, and
    it is taken from each; else the first refusal (the longest wait), nothing taken from any.

    ``limiters``: the GCRA of each (quota key, "mails"/"bytes"); ``depth``: queued mails and
    bytes per queue as last read from the counters; ``charge``: records what is taken."""
    worst: Refusal | None = None
    takes: list[tuple[Gcra, float]] = []
    for q in quotas:
        held = depth.get(q.subject, Depth())
        for limit, value, unit, cap in (("max_queued_mails", held.mails, "mails", q.max_queued_mails),
                                        ("max_queued_bytes", held.bytes, "bytes", q.max_queued_bytes)):
            if cap is not None and value >= cap:
                r = Refusal(q.kind, q.subject, limit, DEPTH_RETRY_S, f"queue {q.subject} holds {value} {unit}, its {limit} is {cap}")
                worst = r if worst is None or r.retry_after_s > worst.retry_after_s else worst
        for what, cost, rate in (("mails", 1.0, q.mails_per_s), ("bytes", float(facts.size), q.bytes_per_s)):
            limiter = limiters.get((q.key, what))
            if rate is None or limiter is None:
                continue
            # A mail larger than the burst passes an idle limiter (and owes the rest after).
            wait = limiter.wait(now, min(cost, limiter.burst))
            if wait > 0:
                r = rate_refusal(q, what, wait)
                worst = r if worst is None or r.retry_after_s > worst.retry_after_s else worst
            else:
                takes.append((limiter, cost))
    if worst is not None:
        return worst
    charge = charge if charge is not None else Charge()
    for limiter, cost in takes:
        charge.take(limiter, now, cost)
    return None


def rate_refusal(q: Quota, what: str, wait: float) -> Refusal:
    """Refused by ``q``'s rate of ``what`` (mails, bytes) for ``wait`` seconds."""
    limit = f"{what}_per_s"
    return Refusal(q.kind, q.subject, limit, max(wait, MIN_RETRY_S), f"{q.kind} {q.subject} is over its {limit} quota ({_rate(q, what)})")


def _rate(q: Quota, what: str) -> str:
    if what == "mails":
        return f"{q.mails_per_s:g} mails/s, burst {q.burst_mails}"
    return f"{q.bytes_per_s:g} bytes/s, burst {q.burst_bytes}"


#: The tenant of the call being served: set per RPC by the access-control interceptor
#: (services/runtime/auth.py): the tenant its token or certificate names, else its identity.
current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("mailqueue_tenant", default="")
