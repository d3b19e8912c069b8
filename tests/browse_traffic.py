"""Browse and admin traffic, seeded: what an operator's tools and a careless script do to browse_svc
(tests/adversary.py does enqueue and dequeue).

``clients`` threads, each with its own ``random.Random(seed * 1000 + i)``, until ``stop`` is set:

- Browse (read to the end, or cancelled after a few mails), GetSize and GetQueue (exact or from
  the counters), ListQueues, CountDeadLetters, on the queue the enqueue/dequeue traffic uses now;
- on queues of their own: EnqueueMany to refill them, DeleteMails, Flush, MoveMails to a side
  queue, ReconcileCounters, UpdateBrowseStart and ClearQueue: the calls that wait for the
  counter updates they made;
- the same deletes with a deadline of a few milliseconds, which expires mid-call (issue 47: such
  a cancel walked a chain of futures in browse_svc), and refused requests (a bad queue name, an
  unknown queue).

Every call is recorded (:class:`Call`). A call "judged" has a deadline of ``DEADLINE_S`` and must
end before it with OK, a precise refusal, or UNAVAILABLE; a call whose short deadline or cancel
is the move itself is recorded, not judged.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable

import grpc

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2, mail_pb2

#: Deadline of every judged call (as tests/adversary.py's): far above what an answer takes, even during
#: an outage, on a loaded machine.
DEADLINE_S = 30.0
#: What a judged call may end with.
ANSWERS = {"OK", "UNAVAILABLE", "NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "ABORTED"}
NAMES = [f"n{i}" for i in range(8)]


@dataclasses.dataclass(frozen=True)
class Call:
    kind: str
    began: float  # time.monotonic()
    seconds: float
    code: str  # "OK" or the status code's name
    judged: bool
    expected: str = ""  # the code a refused request must get ("" : any answer)

    @property
    def fault(self) -> str | None:
        """Why this call breaks the contract, or None."""
        if not self.judged:
            return None
        if self.code == "DEADLINE_EXCEEDED" or self.seconds > DEADLINE_S:
            return f"{self.kind}: no answer within its {DEADLINE_S:g} s deadline ({self.seconds:.1f} s)"
        if self.expected and self.code not in (self.expected, "UNAVAILABLE"):
            return f"{self.kind}: {self.code}, expected {self.expected}"
        if self.code not in ANSWERS:
            return f"{self.kind}: {self.code}"
        return None


class BrowseTraffic:
    def __init__(self, browse, admin, enqueue, current: Callable[[], str], own: list[str], side: str, seed: int,
                 clients: int = 4) -> None:
        self.browse, self.admin, self.enqueue = browse, admin, enqueue
        self.current, self.own, self.side = current, own, side
        self.seed, self.clients = seed, clients
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(DEADLINE_S * 3)

    def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        moves = {self._browse: 4, self._browse_cancelled: 2, self._size: 3, self._info: 2, self._lists: 1,
                 self._fill: 4, self._delete: 2, self._delete_expiring: 2, self._flush: 1, self._move: 1,
                 self._reconcile: 1, self._browse_start: 1, self._clear: 1, self._refused: 1}
        while not self.stop.is_set():
            rng.choices(list(moves), list(moves.values()))[0](rng)

    def _call(self, kind: str, fn: Callable[[], object], judged: bool = True, expected: str = "") -> None:
        began = time.monotonic()
        try:
            fn()
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        with self._lock:
            self.calls.append(Call(kind, began, time.monotonic() - began, code, judged, expected))

    # ------------------------------------------------------------------ reads
    def _browse(self, rng: random.Random) -> None:
        queue = rng.choice([self.current(), *self.own])  # every mail of the traffic's own (small) queues
        request = browse_pb2.BrowseRequest(queue=queue, limit=rng.choice([1, 50, 200] if queue == self.current() else [0, 1, 50]))
        self._call("Browse", lambda: list(self.browse.Browse(request, timeout=DEADLINE_S)))

    def _browse_cancelled(self, rng: random.Random) -> None:
        call = self.browse.Browse(browse_pb2.BrowseRequest(queue=self.current()), timeout=DEADLINE_S)
        wanted = rng.randint(0, 3)

        def read_some() -> None:
            for n, _ in enumerate(call):
                if n >= wanted:
                    break
            call.cancel()

        self._call("Browse cancelled", read_some, judged=False)

    def _size(self, rng: random.Random) -> None:
        request = browse_pb2.GetSizeRequest(queue=rng.choice([self.current(), *self.own]), exact=rng.random() < 0.3)
        self._call("GetSize", lambda: self.browse.GetSize(request, timeout=DEADLINE_S))

    def _info(self, rng: random.Random) -> None:
        request = browse_pb2.GetQueueRequest(queue=self.current(), exact=rng.random() < 0.2)
        self._call("GetQueue", lambda: self.browse.GetQueue(request, timeout=DEADLINE_S))

    def _lists(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            self._call("ListQueues", lambda: self.browse.ListQueues(browse_pb2.ListQueuesRequest(), timeout=DEADLINE_S))
        else:
            request = browse_pb2.CountDeadLettersRequest(queue=self.current())
            self._call("CountDeadLetters", lambda: self.browse.CountDeadLetters(request, timeout=DEADLINE_S))

    # ------------------------------------------------------------------ writes on the traffic's own queues
    def _fill(self, rng: random.Random) -> None:
        queue = rng.choice(self.own)
        many = [enqueue_pb2.EnqueueManyRequest(sequence=n, request=enqueue_pb2.EnqueueRequest(
            queue=queue, mail=mail_pb2.Mail(name=rng.choice(NAMES), sender=f"s{rng.randrange(4)}@example.com",
                                            recipients=["r@example.org"]),
            inline_content=b"Subject: browse traffic\r\n\r\n", delay=_delay(rng)))
            for n in range(rng.randint(1, 20))]
        self._call("EnqueueMany", lambda: list(self.enqueue.EnqueueMany(iter(many), timeout=DEADLINE_S)))

    def _delete(self, rng: random.Random) -> None:
        request = admin_pb2.DeleteMailsRequest(queue=rng.choice(self.own), name=rng.choice(NAMES))
        self._call("DeleteMails", lambda: list(self.admin.DeleteMails(request, timeout=DEADLINE_S)))

    def _delete_expiring(self, rng: random.Random) -> None:
        request = admin_pb2.DeleteMailsRequest(queue=rng.choice(self.own), name=rng.choice(NAMES))
        self._call("DeleteMails expiring", lambda: list(self.admin.DeleteMails(request, timeout=rng.uniform(0.001, 0.05))),
                   judged=False)

    def _flush(self, rng: random.Random) -> None:
        request = admin_pb2.FlushRequest(queue=rng.choice(self.own), sender=f"s{rng.randrange(4)}@example.com")
        self._call("Flush", lambda: self.admin.Flush(request, timeout=DEADLINE_S))

    def _move(self, rng: random.Random) -> None:
        request = admin_pb2.MoveMailsRequest(queue=rng.choice(self.own), to_queue=self.side, name=rng.choice(NAMES), limit=20)
        self._call("MoveMails", lambda: list(self.admin.MoveMails(request, timeout=DEADLINE_S)))

    def _reconcile(self, rng: random.Random) -> None:
        request = admin_pb2.ReconcileCountersRequest(queue=rng.choice(self.own))
        self._call("ReconcileCounters", lambda: self.admin.ReconcileCounters(request, timeout=DEADLINE_S))

    def _browse_start(self, rng: random.Random) -> None:
        request = admin_pb2.UpdateBrowseStartRequest(queue=rng.choice(self.own))  # nothing dequeues there to move it
        self._call("UpdateBrowseStart", lambda: self.admin.UpdateBrowseStart(request, timeout=DEADLINE_S))

    def _clear(self, rng: random.Random) -> None:
        """Empty an own queue now and then: its old slices die and browse start moves on, so its
        scans cost about the same all through the run."""
        request = admin_pb2.ClearQueueRequest(queue=rng.choice(self.own))
        self._call("ClearQueue", lambda: list(self.admin.ClearQueue(request, timeout=DEADLINE_S)))

    def _refused(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            request = browse_pb2.GetSizeRequest(queue="no such queue!")
            self._call("GetSize bad name", lambda: self.browse.GetSize(request, timeout=DEADLINE_S), expected="INVALID_ARGUMENT")
        else:
            request = admin_pb2.DeleteMailsRequest(queue=f"unknown-{rng.randrange(10**6)}", name="x")
            self._call("DeleteMails unknown queue", lambda: list(self.admin.DeleteMails(request, timeout=DEADLINE_S)),
                       expected="NOT_FOUND")


def _delay(rng: random.Random):  # noqa: ANN202 - a protobuf Duration
    from google.protobuf import duration_pb2

    return duration_pb2.Duration(seconds=rng.choice([0, 0, 5, 60]))
