"""The soak (issue 47, item 7): one process of each service through a long adversarial run, with
backend restarts and certificate reloads in the middle.

    python -m tests.soak --minutes 10                 the full run; figures printed, exit 1 on a fault
    python -m tests.soak --minutes 2 --no-restarts    the backends untouched (other runs share them)
    tests/integration/test_soak.py                    a short run in `make test` (marker outage)

The four services run as `make run` has them (TLS, the counter updates gathered for a second, the
queue gauges and the healer on), against the local stack, on a keyspace of their own. The
traffic: tests/adversary.py's enqueue/dequeue clients, round after round on one queue, and
tests/browse_traffic.py's browse and admin clients. Three phases of traffic:

1. before: ``phase_s`` seconds;
2. the disturbances, the traffic going on: the services' certificate renewed, RabbitMQ stopped
   and started (``rabbitmqctl stop_app``), Cassandra frozen (SIGSTOP) then resumed, the
   certificate renewed again; then until every service is SERVING;
3. after: ``phase_s`` seconds, from the moment a mail enqueued is delivered again.

Checked (a fault each, printed): every judged call answered within its deadline, with a status a
client may get; no "Task (or Future) exception was never retrieved" nor RecursionError in any service's log,
and no event loop blocked for ``MAX_BLOCK_S`` (tests/../services/runtime/watchdog.py); every
process alive and SERVING at the end; the answers per second after within 20 % of before.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2_grpc
from stack.harness import ServiceProcess, broker_stopped, new_keyspace, service_env, stack, stack_dir, stack_env, wait_until
from tests.adversary import Adversary, drain
from tests.browse_traffic import BrowseTraffic
from tests.pki import PKI, der, served_certificate

#: The tests' service_env turns these off; the soak runs with their defaults, as `make run` does:
#: counter updates gathered for a second (the path that stalled browse_svc), gauges, the healer.
PRODUCTION_DEFAULTS = ("MAILQUEUE_COUNTER_FLUSH_S", "MAILQUEUE_GAUGE_INTERVAL_S", "MAILQUEUE_HEAL_INTERVAL_S")
#: The view's slice window (a minute) and browse start's pace (a try every 10 deletes): browse
#: start moves on within minutes, so a scan (Browse, an exact size, DeleteMails) costs the same
#: after as before. With the defaults (an hour, 1 in 1000) a scan reads every mail the queue had in
#: the hour, and its cost grows all through a soak.
VIEW = {"MAILQUEUE_SLICE_WINDOW_S": "60", "MAILQUEUE_BROWSE_START_PACE": "10"}
#: Seconds each backend stays down.
OUTAGE_S = 5.0
#: Seconds a round of tests/adversary.py lasts.
ROUND_S = 5.0
#: The rates are also printed by window of this many seconds (where the time goes after a restart).
WINDOW_S = 10.0
#: The answer rate after the disturbances may be this much lower than before.
RATE_TOLERANCE = 0.2
#: A longer event-loop block in a service is a fault (the watchdog logs from 2 s).
MAX_BLOCK_S = 5.0
#: What a service's log must never contain ("Task exception was never retrieved" and "Future
#: exception ...": an error nobody awaited).
NEVER_LOGGED = ("exception was never retrieved", "RecursionError")
#: Counted in the logs, not a fault: Cassandra requests the driver never answered (session.py).
GIVEN_UP = "a Cassandra request the driver never answered was given up"


@dataclasses.dataclass
class Round:
    began: float
    ended: float
    moves: int
    deadline_exceeded: int
    wrong: list[str]


class Rounds(threading.Thread):
    """tests/adversary.py's clients, round after round (a seed each), on one queue: a long day of
    one queue, whose leftovers (mails held, retried, never answered) the next rounds meet."""

    def __init__(self, enqueue, dequeue, admin, clients: int) -> None:
        super().__init__(daemon=True)
        self.enqueue, self.dequeue, self.admin, self.clients = enqueue, dequeue, admin, clients
        self.queue = self.create(f"soak-{uuid.uuid4().hex[:6]}")
        self.rounds: list[Round] = []
        self.stop = threading.Event()

    def create(self, queue: str) -> str:
        """CreateQueue, retried while the service cannot answer (an outage); the queue's name."""
        request = admin_pb2.CreateQueueRequest(queue=queue, retry_policy=browse_pb2.RetryPolicy(max_attempts=3))

        def created() -> bool:
            try:
                self.admin.CreateQueue(request, timeout=10)
                return True
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                return False

        wait_until(created, 120, interval=0.5, what=f"CreateQueue {queue}")
        return queue

    def run(self) -> None:
        seed = 0
        while not self.stop.is_set():
            began = time.monotonic()
            record = Adversary(self.enqueue, self.dequeue, self.queue, seed, self.clients, ROUND_S).run()
            moves = sum(n for what, n in record.calls.items() if not what.startswith("rpc error")
                        and what not in ("unknown tag", "repeated tag", "malformed outcome"))
            self.rounds.append(Round(began, time.monotonic(), moves, record.calls["rpc error DEADLINE_EXCEEDED"], record.wrong))
            seed += 1


class Consumer(threading.Thread):
    """A well-behaved consumer (SUCCESS to every delivery), as a deployment has beside the
    adversary's: the queue stays about as deep all along, so the traffic costs the same before
    and after. Its streams end at their deadline or an outage, and it subscribes again."""

    def __init__(self, dequeue, queue: str) -> None:
        super().__init__(daemon=True)
        self.dequeue, self.queue = dequeue, queue
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            drain(self.dequeue, self.queue, self.stop.is_set, 30)
            self.stop.wait(0.5)  # after an outage ended the stream: subscribe again


class Health(threading.Thread):
    """Every half second, each service's health with a 3 s deadline: the seconds each spent not
    SERVING, and the checks it did not answer at all (a process that holds calls)."""

    def __init__(self, services: dict[str, ServiceProcess]) -> None:
        super().__init__(daemon=True)
        self.stubs = {n: health_pb2_grpc.HealthStub(s.channel()) for n, s in services.items()}
        self.not_serving_s = dict.fromkeys(services, 0.0)
        self.unanswered = dict.fromkeys(services, 0)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for name, stub in self.stubs.items():
                try:
                    ok = stub.Check(health_pb2.HealthCheckRequest(), timeout=3).status == health_pb2.HealthCheckResponse.SERVING
                except grpc.RpcError as e:
                    ok = False
                    self.unanswered[name] += e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                if not ok:
                    self.not_serving_s[name] += 0.5

    def serving(self) -> bool:
        try:
            return all(s.Check(health_pb2.HealthCheckRequest(), timeout=3).status == health_pb2.HealthCheckResponse.SERVING
                       for s in self.stubs.values())
        except grpc.RpcError:
            return False


class Certificates:
    """The services' certificate files, renewed as cert-manager does: a new key and certificate
    written over them; done once every service serves the new one to a new connection."""

    def __init__(self, path: str) -> None:
        self.pki = PKI(path)
        self.cert, self.key = self.pki.issue("server", "mailqueue-soak", "IP:127.0.0.1,DNS:localhost")
        self.renewals = 0

    def renew(self, ports: list[int]) -> None:
        self.renewals += 1
        cert, key = self.pki.issue(f"renewed-{self.renewals}", "mailqueue-soak", "IP:127.0.0.1,DNS:localhost")
        shutil.copy(key, self.key)
        shutil.copy(cert, self.cert)
        for port in ports:
            wait_until(lambda p=port: served_certificate(p, self.pki.ca) == der(self.cert), 30,
                       what=f"the renewed certificate served on port {port}")


class Probe:
    """The data path works end to end again: a mail enqueued now is delivered (SERVING says the
    backends answer; a quorum queue may take longer to take messages again). ``last`` says which
    half failed the last try, and how: what a probe that never succeeds reports."""

    def __init__(self, enqueue, dequeue, queue: str) -> None:
        self.enqueue, self.dequeue, self.queue = enqueue, dequeue, queue
        self.tries, self.last = 0, "no try yet"

    def __call__(self) -> bool:
        import queue as q

        from tests.integration.helpers import StreamConsumer, inline, simple_mail

        self.tries += 1
        try:
            self.enqueue.Enqueue(inline(self.queue, simple_mail("probe")), timeout=10)
        except grpc.RpcError as e:
            self.last = f"Enqueue {e.code().name}: {e.details()}"
            return False
        consumer = None
        try:
            consumer = StreamConsumer(self.dequeue, self.queue, prefetch=1)
            consumer.answer(consumer.next(timeout=10))
            return True
        except (grpc.RpcError, q.Empty, EOFError) as e:
            self.last = f"Enqueue OK, then no delivery in 10 s ({type(e).__name__}: {e})"
            return False
        finally:
            if consumer is not None:
                consumer.close()


def start_services(keyspace: str, certs: Certificates) -> dict[str, ServiceProcess]:
    env = service_env(keyspace, MAILQUEUE_TLS_CERT_FILE=certs.cert, MAILQUEUE_TLS_KEY_FILE=certs.key,
                      MAILQUEUE_TLS_CA_FILE=certs.pki.ca)
    for name in PRODUCTION_DEFAULTS:
        env.pop(name, None)
    env.update(VIEW)
    credentials = certs.pki.credentials()
    services = {"blob": ServiceProcess("blob", env, credentials=credentials, wait=False)}
    env["MAILQUEUE_BLOB_TARGET"] = services["blob"].target
    for name in ("enqueue", "dequeue", "browse"):
        services[name] = ServiceProcess(name, env, credentials=credentials, wait=False)
    for s in services.values():  # started side by side: each waits for its backends (blob_svc too) by itself
        s.wait_serving()
    return services


def disturb(certs: Certificates, ports: list[int], restarts: bool, say) -> None:  # noqa: ANN001 - print-like
    """Renew the certificate, (``restarts``) stop and start RabbitMQ, freeze and resume
    Cassandra, renew the certificate again; the traffic goes on meanwhile."""
    certs.renew(ports)
    say("certificate renewed")
    if restarts:
        restart_backends(say)
    certs.renew(ports)
    say("certificate renewed")


def restart_backends(say) -> None:  # noqa: ANN001 - print-like
    with broker_stopped():
        say("rabbitmq stopped")
        time.sleep(OUTAGE_S)  # the outage's length is the move, not a wait for a state
    say("rabbitmq started")
    with open(os.path.join(stack_dir(), "cassandra.pid")) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGSTOP)
    try:
        say("cassandra frozen")
        time.sleep(OUTAGE_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    say("cassandra resumed")


@dataclasses.dataclass
class Phase:
    began: float
    ended: float

    def windows(self, seconds: float) -> list[Phase]:
        """The phase cut in windows of ``seconds`` (the last one shorter)."""
        starts = [self.began + i * seconds for i in range(max(1, int((self.ended - self.began) // seconds)))]
        return [Phase(b, min(b + seconds, self.ended)) for b in starts]

    def rate(self, rounds: list[Round], calls: list) -> tuple[float, float]:
        """(adversary moves/s over the rounds inside the phase, browse/admin calls/s)."""
        inside = [r for r in rounds if r.began >= self.began and r.ended <= self.ended]
        moves = sum(r.moves for r in inside) / max(sum(r.ended - r.began for r in inside), 1e-9)
        return moves, sum(self.began <= c.began < self.ended for c in calls) / (self.ended - self.began)


def log_faults(services: dict[str, ServiceProcess]) -> tuple[dict[str, dict[str, int]], list[float]]:
    """Per service, how often each NEVER_LOGGED text occurs in its log; every event-loop block logged."""
    counts, blocks = {}, []
    for name, s in services.items():
        text = open(s.log, errors="replace").read() if s.log and os.path.exists(s.log) else ""
        counts[name] = {what: text.count(what) for what in (*NEVER_LOGGED, GIVEN_UP)}
        blocks += [float(b) for b in re.findall(r'"msg": "event loop turns again".*?"blocked_s": ([0-9.]+)', text)]
    return counts, blocks


def soak(phase_s: float, restarts: bool = True, clients: int = 6, seed: int = 0, say=print,  # noqa: ANN001
         rate_tolerance: float = RATE_TOLERANCE, settle_s: float = 0.0) -> list[str]:
    """Run it; the faults found (empty: passed). Figures go to ``say``. ``rate_tolerance``: how
    much lower the answer rate after the disturbances may be than before. ``settle_s``: traffic
    seconds between the recovery and the after phase, not measured (the backends' own warm-up
    after a restart; every call in them is still judged)."""
    keyspace = new_keyspace()
    work = tempfile.mkdtemp(prefix="mailqueue-soak-")
    certs = Certificates(work)
    services = start_services(keyspace, certs)
    ports = [s.port for s in services.values()]
    faults: list[str] = []
    try:
        channel = {n: s.channel() for n, s in services.items()}
        admin = admin_pb2_grpc.AdminServiceStub(channel["browse"])
        browse = browse_pb2_grpc.BrowseServiceStub(channel["browse"])
        enqueue = enqueue_pb2_grpc.EnqueueServiceStub(channel["enqueue"])
        dequeue = dequeue_pb2_grpc.DequeueServiceStub(channel["dequeue"])
        rounds = Rounds(enqueue, dequeue, admin, clients)
        probe = rounds.create(f"soak-probe-{uuid.uuid4().hex[:4]}")
        own = [rounds.create(f"soak-own-{i}-{uuid.uuid4().hex[:4]}") for i in range(2)]
        traffic = BrowseTraffic(browse, admin, enqueue, lambda: rounds.queue, own, rounds.create(f"soak-side-{uuid.uuid4().hex[:4]}"),
                                seed, clients=max(2, clients // 2))
        health = Health(services)
        consumer = Consumer(dequeue, rounds.queue)
        for t in (rounds, traffic, health, consumer):
            t.start()
        before = Phase(time.monotonic(), time.monotonic() + phase_s)
        time.sleep(phase_s)  # the phase's length is the run's, not a wait for a state
        before.ended = time.monotonic()
        disturb(certs, ports, restarts, lambda what: say(f"  {time.monotonic() - before.began:6.1f} s  {what}"))
        wait_until(health.serving, 180, interval=0.5, what="every service SERVING after the disturbances")
        say(f"  {time.monotonic() - before.began:6.1f} s  every service SERVING")
        probing = Probe(enqueue, dequeue, probe)
        try:
            wait_until(probing, 180, interval=0.5, what="a mail enqueued and delivered")
        except AssertionError as e:
            size = browse.GetSize(browse_pb2.GetSizeRequest(queue=probe, exact=True), timeout=30).size
            raise AssertionError(f"{e}: {probing.tries} tries, the last: {probing.last}; "
                                 f"{size} mails in the probe queue; service logs: {[s.log for s in services.values()]}") from None
        say(f"  {time.monotonic() - before.began:6.1f} s  a mail enqueued and delivered: the after phase begins")
        settled = Phase(time.monotonic(), time.monotonic() + settle_s)
        time.sleep(settle_s)  # the phase's length is the run's, not a wait for a state
        after = Phase(time.monotonic(), time.monotonic() + phase_s)
        time.sleep(phase_s)
        after.ended = time.monotonic()
        for t in (rounds, traffic, health, consumer):
            t.stop.set()
        rounds.join(120)
        traffic.join()
        health.join(10)
        consumer.join(60)

        say("queue sizes at the end: " + ", ".join(
            f"{q} {browse.GetSize(browse_pb2.GetSizeRequest(queue=q), timeout=30).size}" for q in (rounds.queue, *own, traffic.side)))
        rates = {}
        for name, phase in (("before", before), ("after", after)):
            moves, calls = phase.rate(rounds.rounds, traffic.calls)
            rates[name] = moves + calls
            say(f"{name}: {phase.ended - phase.began:.0f} s, enqueue/dequeue {moves:.1f} moves/s, browse/admin {calls:.1f} calls/s: "
                f"{rates[name]:.1f} answers/s")
        for name, phase in (("before", before), ("settling", settled), ("after", after)):
            say(f"{name} by {WINDOW_S:.0f} s: " + " ".join(f"{sum(p.rate(rounds.rounds, traffic.calls)):.1f}" for p in phase.windows(WINDOW_S)))
        ratio = rates["after"] / max(rates["before"], 1e-9)
        say(f"rate after/before: {ratio:.2f} (at least {1 - rate_tolerance:.2f})")
        if ratio < 1 - rate_tolerance:
            faults.append(f"the answer rate fell from {rates['before']:.1f}/s to {rates['after']:.1f}/s")

        judged = [c for c in traffic.calls if c.judged]
        call_faults = [f for f in (c.fault for c in traffic.calls) if f]
        say(f"browse/admin calls: {len(traffic.calls)} ({len(judged)} judged), faults {len(call_faults)}; "
            f"statuses {_tally(c.code for c in traffic.calls)}; slowest judged {max((c.seconds for c in judged), default=0):.1f} s")
        say(f"  {'call':<26} {'calls':>6} {'median s before/after':>22} {'slowest s':>10}  statuses")
        for kind in sorted({c.kind for c in traffic.calls}):
            mine = [c for c in traffic.calls if c.kind == kind]
            medians = [_median([c.seconds for c in mine if p.began <= c.began < p.ended]) for p in (before, after)]
            say(f"  {kind:<26} {len(mine):>6} {medians[0]:>11.2f} /{medians[1]:>6.2f}   {max(c.seconds for c in mine):>10.2f}  "
                f"{_tally(c.code for c in mine)}")
        faults += call_faults[:20]
        late = sum(r.deadline_exceeded for r in rounds.rounds)
        wrong = [w for r in rounds.rounds for w in r.wrong]
        say(f"enqueue/dequeue: {len(rounds.rounds)} rounds, {sum(r.moves for r in rounds.rounds)} moves, "
            f"DEADLINE_EXCEEDED {late}, wrong answers {len(wrong)}")
        if late:
            faults.append(f"{late} enqueue/dequeue calls not answered within their deadline")
        faults += wrong[:20]
        say(f"not SERVING (s): {health.not_serving_s}; health checks unanswered in 3 s: {health.unanswered}")
        faults += [f"{n}: {k} health checks unanswered" for n, k in health.unanswered.items() if k]
    finally:
        for s in services.values():
            alive = s.running()
            s.stop()  # SIGKILL: crash-only, and no drain to wait for
            if not alive:
                faults.append(f"{s.name}_svc died: read {s.log}")
        from stack.harness import drop_keyspace

        drop_keyspace(keyspace)
    counts, blocks = log_faults(services)
    say(f"service logs: {counts}; event-loop blocks (s): {blocks}")
    faults += [f"{n}_svc logged {what!r} {k} times: read {services[n].log}" for n, c in counts.items() for what, k in c.items() if k and what in NEVER_LOGGED]
    faults += [f"an event loop blocked for {b:.1f} s" for b in blocks if b > MAX_BLOCK_S]
    return faults


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else float("nan")


def _tally(codes) -> dict[str, int]:  # noqa: ANN001
    out: dict[str, int] = {}
    for c in codes:
        out[c] = out.get(c, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="the whole run: a third before, a third after the disturbances")
    p.add_argument("--clients", type=int, default=6, help="enqueue/dequeue clients (browse/admin: half as many)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-restarts", action="store_true", help="stop no backend (they are shared): only the certificate renewals")
    a = p.parse_args()
    if stack("status", check=False).returncode != 0:
        print("the stack is down: make run", file=sys.stderr)
        return 2
    os.environ.update(stack_env("operator"))  # the backends as the operator, over TLS (as the tests)
    faults = soak(a.minutes * 60 / 3, restarts=not a.no_restarts, clients=a.clients, seed=a.seed)
    for f in faults:
        print(f"FAULT: {f}")
    print("soak passed" if not faults else f"soak failed: {len(faults)} faults")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
