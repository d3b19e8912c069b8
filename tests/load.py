"""Continuous traffic as outside clients make it, with everything recorded for the invariants.

Producers enqueue mails with unique names, each with its name as idempotency key, and retry a
refused enqueue with the same key until it is OK (a client that never gives up on a mail).
Consumers answer SUCCESS to every delivery. The short consumers take up to ``batch`` deliveries
on a Dequeue stream, then half-close it: the server ends a half-closed stream with OK only after
every outcome sent on it was settled (mark deleted, then ack), so an OK end is the server's
confirmation of those SUCCESSes; a stream that ends otherwise confirms nothing. One long consumer
keeps a single stream open for as long as it works (as a real consumer does) and opens a new one
when it breaks: a stream that silently stops receiving after a failover shows up as its gap.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import queue as q
import threading
import time

import grpc

from mailqueue.v1 import dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from stack.harness import wait_until

#: A client's deadline: longer than any server-side timeout, so the server answers first.
DEADLINE_S = 30.0
CONTENT = b"Subject: cluster\r\n\r\n" + b"x" * 1024


@dataclasses.dataclass
class Call:
    at: float
    kind: str  # "enqueue" or "dequeue"
    code: str
    detail: str = ""


class Load:
    def __init__(self, enqueue_target: str, dequeue_target: str, queue: str, producers: int = 3, consumers: int = 2,
                 batch: int = 20, rate_per_producer: float = 40.0, token: str | None = None) -> None:
        self.queue = queue
        #: Sent as "authorization: Bearer <token>" on every call, when the services check tokens.
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.enqueue_target, self.dequeue_target = enqueue_target, dequeue_target
        self.producers, self.consumers, self.batch = producers, consumers, batch
        self.pause = 1.0 / rate_per_producer
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.producing = threading.Event()
        self.producing.set()
        self.threads: list[threading.Thread] = []
        #: name -> enqueue id, for every enqueue answered OK.
        self.acked: dict[str, str] = {}
        self.acked_at: dict[str, float] = {}
        #: enqueue id -> times it was delivered.
        self.deliveries: dict[str, list[float]] = collections.defaultdict(list)
        #: enqueue id -> time the server confirmed its SUCCESS (the stream ended OK).
        self.confirmed: dict[str, float] = {}
        #: When the long consumer received each delivery.
        self.long_deliveries: list[float] = []
        self.calls: list[Call] = []

    # ------------------------------------------------------------------ running
    def start(self) -> Load:
        for i in range(self.producers):
            self._thread(self._produce, f"p{i}")
        self.producer_threads = self.threads[:self.producers]
        for i in range(self.consumers):
            self._thread(self._consume, f"c{i}")
        self._thread(self._consume, "long")
        return self

    def _thread(self, fn, label: str) -> None:
        t = threading.Thread(target=fn, args=(label,), daemon=True, name=f"load-{label}")
        t.start()
        self.threads.append(t)

    def stop_producing(self) -> None:
        """No new mail; returns once each producer has its last mail acked (a mail being retried
        when this is called is acked after it: waiting for deliveries before that missed it)."""
        self.producing.clear()
        for t in self.producer_threads:
            t.join(2 * DEADLINE_S + 10)

    def stop(self) -> None:
        self.stopping.set()
        self.producing.clear()
        for t in self.threads:
            t.join(DEADLINE_S + 10)

    @staticmethod
    def channel(target: str) -> grpc.Channel:
        """A target of several addresses ("ipv4:127.0.0.1:50051,127.0.0.1:50151") is balanced round robin."""
        return grpc.insecure_channel(target, options=[("grpc.lb_policy_name", "round_robin")])

    def record(self, kind: str, code: grpc.StatusCode, detail: str = "") -> None:
        with self.lock:
            self.calls.append(Call(time.monotonic(), kind, code.name, detail[:300]))

    # ------------------------------------------------------------------ producers
    def _produce(self, label: str) -> None:
        stub = enqueue_pb2_grpc.EnqueueServiceStub(self.channel(self.enqueue_target))
        n = 0
        while self.producing.is_set():
            name = f"{label}-{n}-{time.monotonic_ns()}"
            request = enqueue_pb2.EnqueueRequest(
                queue=self.queue, mail=mail_pb2.Mail(name=name, sender="a@example.com", recipients=["b@example.org"]),
                inline_content=CONTENT, idempotency_key=name,
            )
            while not self.stopping.is_set():  # the same mail until it is OK
                try:
                    reply = stub.Enqueue(request, timeout=DEADLINE_S, metadata=self.metadata)
                except grpc.RpcError as e:
                    self.record("enqueue", e.code(), e.details() or "")
                    self.stopping.wait(0.2)  # a client's pause before it retries
                    continue
                self.record("enqueue", grpc.StatusCode.OK)
                with self.lock:
                    self.acked[name] = reply.receipt.enqueue_id
                    self.acked_at[name] = time.monotonic()
                break
            n += 1
            self.stopping.wait(self.pause)  # the producer's pace

    # ------------------------------------------------------------------ consumers
    def _consume(self, label: str) -> None:
        stub = dequeue_pb2_grpc.DequeueServiceStub(self.channel(self.dequeue_target))
        while not self.stopping.is_set():
            self._one_stream(stub, long=label == "long")

    def _one_stream(self, stub, long: bool = False) -> None:
        requests: q.Queue = q.Queue()
        requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=self.queue, prefetch=self.batch)))
        call = stub.Dequeue(iter(requests.get, None), timeout=None if long else DEADLINE_S, metadata=self.metadata)
        answered: list[str] = []
        closed = threading.Event()
        send = threading.Lock()

        def half_close() -> None:  # the server settles what it got, then ends the stream OK
            with send:
                if not closed.is_set():
                    closed.set()
                    requests.put(None)

        # A short stream lasts 2 s, or ``batch`` deliveries; the long one until the load stops.
        timer = threading.Timer(2.0, half_close)
        if long:
            threading.Thread(target=lambda: (self.stopping.wait(), half_close()), daemon=True).start()
        else:
            timer.start()
        try:
            for response in call:
                if response.WhichOneof("kind") != "delivery":
                    continue
                d = response.delivery
                with self.lock:
                    self.deliveries[d.mail.enqueue_id].append(time.monotonic())
                    if long:
                        self.long_deliveries.append(time.monotonic())
                with send:
                    if closed.is_set():
                        continue  # too late to answer: it goes back to the queue unanswered
                    answered.append(d.mail.enqueue_id)
                    requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
                        delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
                if (len(answered) >= self.batch and not long) or self.stopping.is_set():
                    half_close()
            # The stream ended OK: every outcome sent on it was settled by the server.
            self.record("dequeue", grpc.StatusCode.OK)
            now = time.monotonic()
            with self.lock:
                for enqueue_id in answered:
                    self.confirmed.setdefault(enqueue_id, now)
        except grpc.RpcError as e:
            self.record("dequeue", e.code(), e.details() or "")
            self.stopping.wait(0.2)  # a client's pause before it subscribes again
        finally:
            timer.cancel()
            half_close()

    # ------------------------------------------------------------------ facts
    def lost(self) -> list[str]:
        """Acked enqueue ids never delivered."""
        with self.lock:
            return [i for i in self.acked.values() if not self.deliveries.get(i)]

    def delivered_after_confirmed_success(self) -> list[str]:
        with self.lock:
            return [i for i, t in self.confirmed.items() if any(d > t for d in self.deliveries[i])]

    def codes(self, since: float = 0.0, until: float = float("inf")) -> collections.Counter[str]:
        with self.lock:
            return collections.Counter(f"{c.kind}:{c.code}" for c in self.calls if since <= c.at <= until)

    def bad_calls(self) -> list[Call]:
        """Calls that ended with anything but OK or UNAVAILABLE."""
        with self.lock:
            return [c for c in self.calls if c.code not in ("OK", "UNAVAILABLE")]

    def error_details(self, top: int = 6) -> dict[str, int]:
        """The commonest error answers, by kind, status and message (ids and numbers blurred)."""
        import re

        with self.lock:
            c = collections.Counter(
                f"{c.kind}:{c.code}: {re.sub(r'[0-9a-f-]{8,}|[0-9.]+', '#', c.detail)[:160]}"
                for c in self.calls if c.code != "OK")
        return dict(c.most_common(top))

    def first_ok(self, kind: str, after: float) -> float | None:
        """Seconds from ``after`` to the first OK call of that kind that ended after it."""
        with self.lock:
            times = [c.at for c in self.calls if c.kind == kind and c.code == "OK" and c.at >= after]
        return min(times) - after if times else None

    def first_delivery(self, after: float) -> float | None:
        with self.lock:
            times = [t for ts in self.deliveries.values() for t in ts if t >= after]
        return min(times) - after if times else None

    def longest_gap(self, kind: str, since: float, until: float) -> float:
        """The longest time without an OK call of that kind within [since, until]."""
        with self.lock:
            times = sorted(c.at for c in self.calls if c.kind == kind and c.code == "OK" and since <= c.at <= until)
        marks = [since, *times, until]
        return max(b - a for a, b in zip(marks, marks[1:]))

    def ran_past(self, instant: float) -> bool:
        """A call ended at or after ``instant``: the load was running through until then."""
        with self.lock:
            return any(c.at >= instant for c in self.calls)

    def run_through_fault(self, start: float, seconds: float) -> None:
        """Hold a fault for ``seconds`` of traffic: until a call of the load ends that late (a load
        that stalled completely holds it longer, never shorter)."""
        wait_until(lambda: self.ran_past(start + seconds), seconds + 60, interval=0.2,
                   what=f"{seconds:.0f} s of traffic through the fault")

    def wait_delivered(self, timeout: float) -> list[str]:
        """Poll until every acked mail was delivered at least once (consumers keep running); the
        ones still missing."""
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not self.lost(), timeout, interval=0.5, what="every acked mail delivered")
        return self.lost()
