"""An adversarial client, seeded: the traffic an outside tester makes, through gRPC only.

``clients`` threads share one queue for ``seconds``. Each draws its moves from its own
``random.Random(seed * 1000 + i)``, so a seed replays the same choices (the interleaving of the
threads is the machine's). Half of them produce:

- Enqueue, EnqueueStream, EnqueueMany and EnqueueBatches, with valid and invalid mails mixed;
- EnqueueStream calls cancelled mid-stream (header and a chunk sent, the rest never);
- idempotency keys sent again, after an answer and after a cancelled attempt;
- delays of up to 2 s and every priority.

The other half consume: Dequeue streams with a random prefetch and batch size, answering SUCCESS,
RETRY (a random ``retry_after`` of up to 1.5 s), REJECT or nothing, with unknown, repeated and
malformed delivery tags among them, and cancelling or half-closing at random instants.

What the clients were told is recorded: every acknowledged mail, the mails a client REJECTed or
RETRYed (dead for a reason the client caused: rejected, or expired by the queue's retry policy).
``settle`` then drains the queue with a well-behaved consumer and returns the acknowledged mails
that are neither delivered nor dead for such a reason (stranded) within a deadline.

Run alone: ``python -m tests.adversary --seeds 0-19`` against the running services (make run).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import queue as q
import random
import threading
import time
import uuid

import grpc

from mailqueue.v1 import dequeue_pb2, enqueue_pb2, mail_pb2

CONTENT = b"Subject: adversary\r\n\r\n"
#: Codes a refused bad input may get (each is a precise refusal, never OK and never INTERNAL).
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.FAILED_PRECONDITION}
#: Codes a valid call may end with under this traffic (a key whose first attempt is still running).
RETRYABLE = {grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE}
DEADLINE_S = 30.0


@dataclasses.dataclass
class Record:
    """What the clients were told."""

    acked: dict[str, str] = dataclasses.field(default_factory=dict)  # enqueue id -> mail name
    rejected: set[str] = dataclasses.field(default_factory=set)  # enqueue ids a client REJECTed
    retried: set[str] = dataclasses.field(default_factory=set)  # enqueue ids a client RETRYed
    unanswered: set[str] = dataclasses.field(default_factory=set)  # handed to a client that never answered
    keys: dict[str, tuple[str, bytes]] = dataclasses.field(default_factory=dict)  # key -> (enqueue id, content)
    pending_keys: list[tuple[str, bytes]] = dataclasses.field(default_factory=list)  # sent, outcome unknown
    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    wrong: list[str] = dataclasses.field(default_factory=list)  # answers no client should get


class Adversary:
    def __init__(self, enqueue_stub, dequeue_stub, queue: str, seed: int, clients: int = 8, seconds: float = 4.0) -> None:
        self.enqueue, self.dequeue, self.queue = enqueue_stub, dequeue_stub, queue
        self.seed, self.clients, self.seconds = seed, clients, seconds
        self.record = Record()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    # ------------------------------------------------------------------ running
    def run(self) -> Record:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]
        for t in threads:
            t.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for t in threads:
            t.join(DEADLINE_S * 2)
        return self.record

    def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        work = self._produce if i % 2 == 0 else self._consume
        while not self.stop.is_set():
            try:
                work(rng)
            except grpc.RpcError as e:
                self._count(f"rpc error {e.code().name}")
                if e.code() not in RETRYABLE | REFUSALS | {grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}:
                    self._wrong(f"client {i}: {e.code().name}: {e.details()}")

    def _count(self, what: str) -> None:
        with self.lock:
            self.record.calls[what] += 1

    def _wrong(self, what: str) -> None:
        with self.lock:
            self.record.wrong.append(what)

    # ------------------------------------------------------------------ producing
    def _mail(self, rng: random.Random, valid: bool = True) -> enqueue_pb2.EnqueueRequest:
        name = f"s{self.seed}-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
        request = enqueue_pb2.EnqueueRequest(
            queue=self.queue, mail=mail_pb2.Mail(name=name, sender="a@example.com", recipients=["b@example.org"]),
            inline_content=CONTENT + name.encode(),
            priority=rng.choice([mail_pb2.PRIORITY_UNSPECIFIED, mail_pb2.PRIORITY_HIGH, mail_pb2.PRIORITY_LOW]),
        )
        if rng.random() < 0.2:
            request.delay.FromMilliseconds(rng.randrange(0, 2000))
        if rng.random() < 0.3:
            request.idempotency_key = f"k-{name}"
        if not valid:
            self._spoil(rng, request)
        return request

    @staticmethod
    def _spoil(rng: random.Random, r: enqueue_pb2.EnqueueRequest) -> None:
        choice = rng.randrange(6)
        if choice == 0:
            r.queue = "no such queue!"
        elif choice == 1:
            r.ClearField("inline_content")  # no content
        elif choice == 2:
            r.idempotency_key = "k" * 300
        elif choice == 3:
            r.delay.FromSeconds(10 ** 9)  # out of range
        elif choice == 4:
            r.mail.sender = "not an address"
            r.mail.ClearField("recipients")
        else:
            r.priority = 77  # not a Priority

    def _ack(self, request: enqueue_pb2.EnqueueRequest, receipt: enqueue_pb2.Receipt) -> None:
        with self.lock:
            key = request.idempotency_key
            if key and key in self.record.keys and self.record.keys[key][0] != receipt.enqueue_id:
                self.record.wrong.append(f"key {key} answered {receipt.enqueue_id}, earlier {self.record.keys[key][0]}")
            if key:
                self.record.keys.setdefault(key, (receipt.enqueue_id, request.inline_content))
            self.record.acked[receipt.enqueue_id] = request.mail.name

    def _answered(self, request: enqueue_pb2.EnqueueRequest, valid: bool, error: grpc.RpcError | None,
                  receipt: enqueue_pb2.Receipt | None) -> None:
        if receipt is not None:
            if not valid:
                self._wrong(f"an invalid enqueue was accepted: {request}")
            self._ack(request, receipt)
        elif valid and error is not None and error.code() not in RETRYABLE:
            self._wrong(f"a valid enqueue got {error.code().name}: {error.details()}")
        elif not valid and error is not None and error.code() not in REFUSALS:
            self._wrong(f"an invalid enqueue got {error.code().name}: {error.details()}")

    def _produce(self, rng: random.Random) -> None:
        move = rng.choices(["unary", "stream", "cancelled", "many", "batches", "again"], [4, 2, 2, 2, 2, 1])[0]
        self._count(move)
        if move == "unary":
            valid = rng.random() < 0.8
            request = self._mail(rng, valid)
            try:
                self._answered(request, valid, None, self.enqueue.Enqueue(request, timeout=DEADLINE_S).receipt)
            except grpc.RpcError as e:
                self._answered(request, valid, e, None)
        elif move in ("stream", "cancelled"):
            self._stream(rng, self._mail(rng), cancel=move == "cancelled")
        elif move == "again":
            self._again(rng)
        else:
            items = [(self._mail(rng, valid), valid) for valid in (rng.random() < 0.8 for _ in range(rng.randint(1, 40)))]
            many = [enqueue_pb2.EnqueueManyRequest(sequence=n, request=r) for n, (r, _v) in enumerate(items)]
            if move == "many":
                answers = list(self.enqueue.EnqueueMany(iter(many), timeout=DEADLINE_S))
            else:
                size = rng.randint(1, 16)
                batches = [enqueue_pb2.EnqueueBatchesRequest(mails=many[k:k + size]) for k in range(0, len(many), size)]
                answers = [a for b in self.enqueue.EnqueueBatches(iter(batches), timeout=DEADLINE_S) for a in b.results]
            if len(answers) != len(items):
                self._wrong(f"{move}: {len(items)} mails, {len(answers)} answers")
            for a in answers:
                request, valid = items[a.sequence]
                if a.HasField("receipt"):
                    self._answered(request, valid, None, a.receipt)
                else:
                    code = next((c for c in grpc.StatusCode if c.value[0] == a.error.code), grpc.StatusCode.UNKNOWN)
                    self._answered(request, valid, _Refused(code, a.error.message), None)

    def _stream(self, rng: random.Random, request: enqueue_pb2.EnqueueRequest, cancel: bool) -> None:
        header = enqueue_pb2.EnqueueHeader(
            queue=request.queue, mail=request.mail, idempotency_key=request.idempotency_key, priority=request.priority)
        if request.HasField("delay"):
            header.delay.CopyFrom(request.delay)
        content = request.inline_content
        parts = [enqueue_pb2.EnqueueStreamRequest(header=header)]
        parts += [enqueue_pb2.EnqueueStreamRequest(chunk=content[k:k + 8]) for k in range(0, len(content), 8)]
        if not cancel:
            try:
                receipt = self.enqueue.EnqueueStream(iter(parts), timeout=DEADLINE_S).receipt
            except grpc.RpcError as e:
                self._answered(request, True, e, None)
                return
            self._answered(request, True, None, receipt)
            return
        hold = threading.Event()

        def requests():
            yield from parts[:2]
            hold.wait(DEADLINE_S)  # the rest never comes

        call = self.enqueue.EnqueueStream.future(requests(), timeout=DEADLINE_S)
        time.sleep(rng.uniform(0, 0.05))  # the instant of the cancel is the move
        call.cancel()
        hold.set()
        if request.idempotency_key:
            with self.lock:
                self.record.pending_keys.append((request.idempotency_key, content))

    def _again(self, rng: random.Random) -> None:
        """An idempotency key sent again: one already answered, or one whose attempt was cancelled."""
        with self.lock:
            answered = list(self.record.keys.items())
            pending = list(self.record.pending_keys)
        if pending and (rng.random() < 0.5 or not answered):
            key, content = rng.choice(pending)
            expected = None
        elif answered:
            key, (expected, content) = rng.choice(answered)
        else:
            return
        name = key[2:]
        request = enqueue_pb2.EnqueueRequest(queue=self.queue, inline_content=content, idempotency_key=key,
                                             mail=mail_pb2.Mail(name=name, sender="a@example.com", recipients=["b@example.org"]))
        try:
            receipt = self.enqueue.Enqueue(request, timeout=DEADLINE_S).receipt
        except grpc.RpcError as e:
            self._answered(request, True, e, None)
            return
        if expected is not None and (receipt.enqueue_id != expected or not receipt.duplicate):
            self._wrong(f"key {key} sent again: {receipt.enqueue_id} duplicate={receipt.duplicate}, expected {expected}")
        self._ack(request, receipt)

    # ------------------------------------------------------------------ consuming
    def _consume(self, rng: random.Random) -> None:
        self._count("dequeue stream")
        requests: q.Queue = q.Queue()
        prefetch, max_batch = rng.randint(1, 32), rng.choice([0, 0, 4, 16])
        requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=self.queue, prefetch=prefetch,
                                                                               max_batch=max_batch)))
        call = self.dequeue.Dequeue(iter(requests.get, None), timeout=DEADLINE_S)
        lifetime, cancel = rng.uniform(0.05, 1.5), rng.random() < 0.5
        answered: list[int] = []

        def leave() -> None:
            """At the end of its lifetime (or of the run) the client cancels or half-closes; after a
            half-close the server settles what was answered and ends the stream."""
            if cancel:
                call.cancel()
            else:
                requests.put(None)

        timer = threading.Timer(lifetime, leave)
        timer.start()
        stopping = threading.Thread(target=lambda: self.stop.wait() and timer.cancel() is None and leave(), daemon=True)
        stopping.start()

        def outcome(tag: int, kind: int, retry_after: float | None = None) -> dequeue_pb2.DequeueRequest:
            o = dequeue_pb2.Outcome(delivery_tag=tag, kind=kind, error_message="adversary")
            if retry_after is not None:
                o.retry_after.FromMilliseconds(int(retry_after * 1000))
            return dequeue_pb2.DequeueRequest(outcome=o)

        try:
            for response in call:
                if response.WhichOneof("kind") == "subscribed":
                    continue
                batch = [response.delivery] if response.HasField("delivery") else list(response.deliveries.deliveries)
                for d in batch:
                    choice = rng.random()
                    if choice < 0.6:
                        requests.put(outcome(d.delivery_tag, dequeue_pb2.OUTCOME_KIND_SUCCESS))
                    elif choice < 0.8:
                        with self.lock:
                            self.record.retried.add(d.mail.enqueue_id)
                        requests.put(outcome(d.delivery_tag, dequeue_pb2.OUTCOME_KIND_RETRY, rng.uniform(0, 1.5)))
                    elif choice < 0.85:
                        with self.lock:
                            self.record.rejected.add(d.mail.enqueue_id)
                        requests.put(outcome(d.delivery_tag, dequeue_pb2.OUTCOME_KIND_REJECT))
                    else:
                        with self.lock:
                            self.record.unanswered.add(d.mail.enqueue_id)
                        continue  # never answered
                    answered.append(d.delivery_tag)
                bad = rng.random()
                if bad < 0.03:
                    self._count("unknown tag")
                    requests.put(outcome(rng.randrange(10**6, 10**9), dequeue_pb2.OUTCOME_KIND_SUCCESS))
                elif bad < 0.06 and answered:
                    self._count("repeated tag")
                    requests.put(outcome(rng.choice(answered), rng.choice([1, 2, 3])))
                elif bad < 0.08:
                    self._count("malformed outcome")
                    requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=1)))
        finally:
            timer.cancel()
            leave()


class _Refused(grpc.RpcError):
    """An error answered inside an EnqueueMany/EnqueueBatches stream, as an RpcError."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def drain(dequeue_stub, queue: str, until, deadline_s: float) -> None:
    """A well-behaved consumer: SUCCESS to every delivery until ``until()`` holds or the deadline."""
    requests: q.Queue = q.Queue()
    requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=64)))
    call = dequeue_stub.Dequeue(iter(requests.get, None), timeout=deadline_s)
    done = threading.Event()

    def answer() -> None:
        try:
            for response in call:
                if response.HasField("delivery"):
                    requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
                        delivery_tag=response.delivery.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=answer, daemon=True).start()
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end and not until():
            done.wait(0.5)
    finally:
        requests.put(None)
        done.wait(10)
        call.cancel()


def _seeds(text: str) -> list[int]:
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    import os

    from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2_grpc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-19")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--deadline", type=float, default=90.0)
    a = p.parse_args()
    host = os.environ.get("MAILQUEUE_CLIENT_HOST", "127.0.0.1")
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(f"{host}:50051"))
    dequeue = dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(f"{host}:50052"))
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"{host}:50053"))
    browse = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(f"{host}:50053"))
    failed = 0
    for seed in _seeds(a.seeds):
        queue = f"adv-{seed}-{uuid.uuid4().hex[:6]}"
        admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue, retry_policy=browse_pb2.RetryPolicy(max_attempts=3)))
        record = Adversary(enqueue, dequeue, queue, seed, a.clients, a.seconds).run()
        left = lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size  # noqa: E731
        drain(dequeue, queue, lambda: left() == 0, a.deadline)
        stranded = left()
        failed += bool(stranded or record.wrong)
        print(f"seed {seed}: acked {len(record.acked)}, stranded {stranded}, wrong answers {len(record.wrong)}, "
              f"calls {dict(record.calls)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
