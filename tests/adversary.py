"""An adversarial client, seeded: the traffic an outside tester makes, through gRPC only.

``clients`` threads share one queue for ``seconds``. Each draws its moves from its own
``random.Random(seed * 1000 + i)``, so a seed replays the same choices (the interleaving of the
threads is the machine's). Half of them produce:

- Enqueue, EnqueueStream, EnqueueMany and EnqueueBatches, with valid and invalid mails mixed;
- EnqueueStream calls cancelled mid-stream (header and a chunk sent, the rest never);
- idempotency keys sent again, after an answer and after a cancelled attempt;
- delays of up to 2 s and every priority.

The other half consume, in three kinds of Dequeue stream:

- random: a random prefetch and batch size, answering SUCCESS, RETRY (a random ``retry_after`` of
  up to 1.5 s), REJECT or nothing, with unknown, repeated and malformed delivery tags among them,
  and cancelling or half-closing at random instants;
- clean: take 1 to 3 deliveries, answer each SUCCESS, half-close, read until the server ends the
  stream;
- double: answer one delivery twice at once (RETRY then RETRY or REJECT, SUCCESS then SUCCESS),
  which ends the stream with INVALID_ARGUMENT.

What the clients were told is recorded: every acknowledged mail, the mails a client REJECTed or
RETRYed (dead for a reason the client caused: rejected, or expired by the queue's retry policy),
every delivery read (with the instant the server handed it out, ``Delivery.handed_out_at``), and
every SUCCESS the server confirmed: answered on a stream that then ended OK, or answered before
an invalid answer (the server carries out every answer read before it). ``after_success`` lists
the deliveries of a mail handed out after a confirmed SUCCESS of it: there must be none (#47).
``drain`` then empties the queue with a well-behaved consumer.

``play`` runs one seed and the drain; run alone, ``python -m tests.adversary --seeds 0-19`` starts
the services of this checkout against the running stack (make run) and prints each seed's figures.
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

from mailqueue.v1 import browse_pb2, dequeue_pb2, enqueue_pb2, mail_pb2

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
    seen: list[Seen] = dataclasses.field(default_factory=list)  # every delivery a consumer read
    confirmed: list[Confirmed] = dataclasses.field(default_factory=list)  # SUCCESSes the server confirmed


@dataclasses.dataclass(frozen=True)
class Seen:
    """One delivery as a consumer read it."""

    enqueue_id: str
    stream: int  # which stream read it (numbered per run; the drain is -1)
    tag: int
    handed_out_at: float  # the server's clock (Delivery.handed_out_at), seconds since the epoch
    read_at: float  # the client's clock when it read it
    attempts: int = 0  # the mail's RETRYs before this delivery (a RETRY's copy has one more)


@dataclasses.dataclass(frozen=True)
class Confirmed:
    """A SUCCESS the server confirmed: the delivery answered, and when the client learnt it."""

    delivery: Seen
    confirmed_at: float  # the client's clock: the stream's OK end (or its error, after an invalid answer)
    #: "clean", "random" (a random stream that ended OK), "double" (answered before an invalid
    #: answer) or "drain"
    how: str


@dataclasses.dataclass(frozen=True)
class Again:
    """A delivery of a mail handed out after a delivery of it that was answered SUCCESS."""

    confirmed: Confirmed
    delivery: Seen

    @property
    def after_the_end(self) -> bool:
        """Handed out after the client learnt of the SUCCESS (clocks of one machine compared);
        otherwise while the answered delivery was out: two copies of the mail out at once."""
        return self.delivery.handed_out_at > self.confirmed.confirmed_at

    def __str__(self) -> str:
        c, d = self.confirmed, self.delivery
        return (f"{d.enqueue_id}: answered SUCCESS on stream {c.delivery.stream} ({c.how}; handed out "
                f"{c.delivery.handed_out_at:.3f}, confirmed {c.confirmed_at:.3f}), handed out again to stream "
                f"{d.stream} at {d.handed_out_at:.3f} ({'after' if self.after_the_end else 'before'} the confirmation), "
                f"attempts {c.delivery.attempts} then {d.attempts}")


def after_success(record: Record) -> list[Again]:
    """The deliveries of a mail handed out after one of its deliveries was answered SUCCESS and the
    server confirmed it. Ordered by the server's clock, so a copy read late by a client but handed
    out before (a stream that gave it back unanswered) is not counted. Must be empty (DESIGN §5.2)."""
    by_mail: dict[str, list[Seen]] = collections.defaultdict(list)
    for d in record.seen:
        by_mail[d.enqueue_id].append(d)
    return [Again(c, d) for c in record.confirmed for d in by_mail[c.delivery.enqueue_id]
            if d != c.delivery and d.handed_out_at > c.delivery.handed_out_at]


class Adversary:
    def __init__(self, enqueue_stub, dequeue_stub, queue: str, seed: int, clients: int = 8, seconds: float = 4.0,
                 min_acked: int = 0) -> None:
        self.enqueue, self.dequeue, self.queue = enqueue_stub, dequeue_stub, queue
        self.seed, self.clients, self.seconds, self.min_acked = seed, clients, seconds, min_acked
        self.record = Record()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._streams = 0

    # ------------------------------------------------------------------ running
    def run(self) -> Record:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]
        for t in threads:
            t.start()
        # At least ``seconds`` of play, and on a loaded machine longer, until ``min_acked`` mails
        # were acknowledged (at most 8 times ``seconds``): the moves, not the clock, make the test.
        started = time.monotonic()
        self.stop.wait(self.seconds)
        while len(self.record.acked) < self.min_acked and time.monotonic() - started < self.seconds * 8:
            self.stop.wait(0.1)
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
        move = rng.choices(["random", "clean", "double"], [3, 2, 1])[0]
        self._count(f"dequeue stream ({move})")
        with self.lock:
            self._streams += 1
            stream = self._streams
        {"random": self._random_stream, "clean": self._clean_stream, "double": self._double_answer}[move](rng, stream)

    def _subscribe(self, rng: random.Random) -> tuple[Requests, grpc.Call]:
        prefetch, max_batch = rng.randint(1, 32), rng.choice([0, 0, 4, 16])
        requests = Requests(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(
            queue=self.queue, prefetch=prefetch, max_batch=max_batch)))
        return requests, self.dequeue.Dequeue(iter(requests), timeout=DEADLINE_S)

    def _read(self, stream: int, response: dequeue_pb2.DequeueResponse) -> list[Seen]:
        """The deliveries of one response, recorded as read."""
        batch = [response.delivery] if response.HasField("delivery") else list(response.deliveries.deliveries)
        seen = [seen_now(stream, d) for d in batch]
        with self.lock:
            self.record.seen.extend(seen)
        return seen

    def _note_answer(self, d: Seen, kind: int) -> None:
        """Record an answer sent (REJECT and RETRY: the mail may end for a reason this client caused)."""
        with self.lock:
            if kind == dequeue_pb2.OUTCOME_KIND_RETRY:
                self.record.retried.add(d.enqueue_id)
            elif kind == dequeue_pb2.OUTCOME_KIND_REJECT:
                self.record.rejected.add(d.enqueue_id)

    def _unanswered(self, d: Seen) -> None:
        with self.lock:
            self.record.unanswered.add(d.enqueue_id)

    def _confirm(self, answered: list[Seen], how: str) -> None:
        now = time.time()
        with self.lock:
            self.record.confirmed.extend(Confirmed(d, now, how) for d in answered)

    def _ending(self, rng: random.Random, leave) -> threading.Timer:
        """Call ``leave`` at the end of a random lifetime, or at the end of the run."""
        timer = threading.Timer(rng.uniform(0.05, 1.5), leave)
        timer.start()
        threading.Thread(target=lambda: self.stop.wait() and timer.cancel() is None and leave(), daemon=True).start()
        return timer

    def _random_stream(self, rng: random.Random, stream: int) -> None:
        requests, call = self._subscribe(rng)
        cancel = rng.random() < 0.5
        answered: list[int] = []
        succeeded: list[Seen] = []

        def leave() -> None:
            """At the end of its lifetime (or of the run) the client cancels or half-closes; after a
            half-close the server settles what was answered and ends the stream."""
            if cancel:
                call.cancel()
            else:
                requests.half_close()

        timer = self._ending(rng, leave)
        ended_ok = False
        try:
            for response in call:
                if response.WhichOneof("kind") == "subscribed":
                    continue
                for d in self._read(stream, response):
                    choice = rng.random()
                    if choice < 0.6:
                        kind, retry_after = dequeue_pb2.OUTCOME_KIND_SUCCESS, None
                    elif choice < 0.8:
                        kind, retry_after = dequeue_pb2.OUTCOME_KIND_RETRY, rng.uniform(0, 1.5)
                    elif choice < 0.85:
                        kind, retry_after = dequeue_pb2.OUTCOME_KIND_REJECT, None
                    else:
                        self._unanswered(d)
                        continue  # never answered
                    if not requests.send(outcome(d.tag, kind, retry_after)):
                        self._unanswered(d)  # half-closed meanwhile
                        continue
                    self._note_answer(d, kind)
                    answered.append(d.tag)
                    if kind == dequeue_pb2.OUTCOME_KIND_SUCCESS:
                        succeeded.append(d)
                bad = rng.random()
                if bad < 0.03:
                    self._count("unknown tag")
                    requests.send(outcome(rng.randrange(10**6, 10**9), dequeue_pb2.OUTCOME_KIND_SUCCESS))
                elif bad < 0.06 and answered:
                    self._count("repeated tag")
                    requests.send(outcome(rng.choice(answered), rng.choice([1, 2, 3])))
                elif bad < 0.08:
                    self._count("malformed outcome")
                    requests.send(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=1)))
            ended_ok = not cancel
        finally:
            timer.cancel()
            leave()
        if ended_ok:  # ended OK after a half-close: every answer read was carried out
            self._confirm(succeeded, "random")

    def _clean_stream(self, rng: random.Random, stream: int) -> None:
        """Take 1 to 3 deliveries, answer each SUCCESS, half-close, and read until the server ends
        the stream (what it handed out before it read the half-close comes back unanswered)."""
        requests, call = self._subscribe(rng)
        want, answered = rng.randint(1, 3), []
        timer = self._ending(rng, requests.half_close)  # fewer deliveries than wanted: half-close anyway
        try:
            for response in call:
                if response.WhichOneof("kind") == "subscribed":
                    continue
                for d in self._read(stream, response):
                    if len(answered) < want and requests.send(outcome(d.tag, dequeue_pb2.OUTCOME_KIND_SUCCESS)):
                        answered.append(d)
                        if len(answered) == want:
                            requests.half_close()
                    else:
                        self._unanswered(d)
        finally:
            timer.cancel()
            requests.half_close()
        self._confirm(answered, "clean")  # the stream ended OK

    def _double_answer(self, rng: random.Random, stream: int) -> None:
        """Answer the first delivery twice at once (in one Outcomes message or in two messages),
        half-close, read to the end: the second answer fails the stream with INVALID_ARGUMENT, and
        the first is carried out."""
        requests, call = self._subscribe(rng)
        first, second = rng.choice([(dequeue_pb2.OUTCOME_KIND_RETRY, dequeue_pb2.OUTCOME_KIND_RETRY),
                                    (dequeue_pb2.OUTCOME_KIND_RETRY, dequeue_pb2.OUTCOME_KIND_REJECT),
                                    (dequeue_pb2.OUTCOME_KIND_SUCCESS, dequeue_pb2.OUTCOME_KIND_SUCCESS)])
        together = rng.random() < 0.5
        timer = self._ending(rng, requests.half_close)
        answered: Seen | None = None
        try:
            for response in call:
                if response.WhichOneof("kind") == "subscribed":
                    continue
                for d in self._read(stream, response):
                    if answered is not None:
                        self._unanswered(d)
                        continue
                    two = [outcome(d.tag, k, 0.0 if k == dequeue_pb2.OUTCOME_KIND_RETRY else None) for k in (first, second)]
                    if together:
                        two = [dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(outcomes=[a.outcome for a in two]))]
                    if requests.send(*two):
                        self._note_answer(d, first)
                        answered = d
                        requests.half_close()
                    else:
                        self._unanswered(d)
        except grpc.RpcError as e:
            if answered is None or e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            self._count("double answer refused")
            if first == dequeue_pb2.OUTCOME_KIND_SUCCESS:
                self._confirm([answered], "double")  # read before the invalid answer: carried out
            return
        finally:
            timer.cancel()
            requests.half_close()
        if answered is not None:
            self._wrong(f"stream {stream}: a second answer to delivery {answered.tag} was not refused")


class Requests:
    """A Dequeue stream's requests as the client sends them: messages, then the half-close, after
    which nothing more is sent (so a client knows which of its answers went out)."""

    def __init__(self, first: dequeue_pb2.DequeueRequest) -> None:
        self._queue: q.Queue = q.Queue()
        self._queue.put(first)
        self._closed = False
        self._lock = threading.Lock()

    def send(self, *messages: dequeue_pb2.DequeueRequest) -> bool:
        """Send ``messages`` in order (together); False when the stream was half-closed before."""
        with self._lock:
            if self._closed:
                return False
            for m in messages:
                self._queue.put(m)
            return True

    def half_close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)

    def __iter__(self):
        return iter(self._queue.get, None)


def seen_now(stream: int, d: dequeue_pb2.Delivery) -> Seen:
    return Seen(d.mail.enqueue_id, stream, d.delivery_tag, d.handed_out_at.ToNanoseconds() / 1e9, time.time(), d.mail.attempts)


def outcome(tag: int, kind: int, retry_after: float | None = None) -> dequeue_pb2.DequeueRequest:
    o = dequeue_pb2.Outcome(delivery_tag=tag, kind=kind, error_message="adversary")
    if retry_after is not None:
        o.retry_after.FromMilliseconds(int(retry_after * 1000))
    return dequeue_pb2.DequeueRequest(outcome=o)


class _Refused(grpc.RpcError):
    """An error answered inside an EnqueueMany/EnqueueBatches stream, as an RpcError."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def drain(dequeue_stub, queue: str, until, deadline_s: float, record: Record | None = None) -> set[str]:
    """A well-behaved consumer: SUCCESS to every delivery until ``until()`` holds or the deadline,
    then a half-close. Returns the enqueue ids it answered. Each delivery read is added to
    ``record.seen`` (stream -1), and its SUCCESSes to ``record.confirmed`` when the stream ends OK."""
    requests = Requests(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=64)))
    call = dequeue_stub.Dequeue(iter(requests), timeout=deadline_s)
    done = threading.Event()
    answered: list[Seen] = []
    seen: list[Seen] = []
    ended_ok: list[float] = []

    def answer() -> None:
        try:
            for response in call:
                if response.HasField("delivery"):
                    d = seen_now(-1, response.delivery)
                    seen.append(d)
                    if requests.send(outcome(d.tag, dequeue_pb2.OUTCOME_KIND_SUCCESS)):
                        answered.append(d)
            ended_ok.append(time.time())
        except grpc.RpcError:
            pass
        done.set()

    threading.Thread(target=answer, daemon=True).start()
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end and not until():
            done.wait(0.5)
    finally:
        requests.half_close()
        done.wait(10)
        call.cancel()
    if record is not None:
        record.seen.extend(seen)
        record.confirmed.extend(Confirmed(d, ended_ok[0], "drain") for d in answered if ended_ok)
    return {d.enqueue_id for d in answered}


#: How long the queue's counters may lag behind its mails once the streams ended: each process
#: gathers its counter updates for MAILQUEUE_COUNTER_FLUSH_S (1 s by default) before writing them;
#: the rest is the writes and the exact count on a loaded machine (measured: up to 1.6 s).
SIZE_LAG_S = 5.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    """GetSize once the streams ended: the counters' answer and the exact one, and how long after
    the streams ended the two first agreed (infinite: not within SIZE_LAG_S)."""

    counted: int
    exact: int
    lag_s: float


def sizes(browse_stub, queue: str, lag_s: float = SIZE_LAG_S) -> Sizes:
    """Poll GetSize (counters) against GetSize (exact) until they agree, for ``lag_s`` at most."""
    start = time.monotonic()
    while True:
        counted = browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size
        exact = browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size
        waited = time.monotonic() - start
        if counted == exact or waited > lag_s:
            return Sizes(counted, exact, waited if counted == exact else float("inf"))
        time.sleep(0.1)  # the poll's interval


@dataclasses.dataclass(frozen=True)
class Played:
    """One seed's run, then the drain: what the clients were told, GetSize once the streams ended,
    the mails the drain took, the acknowledged mails still undecided after it, and the deliveries
    after a confirmed SUCCESS (``after_success``)."""

    record: Record
    size: Sizes
    drained: set[str]
    stranded: list[str]
    again: list[Again]

    def __str__(self) -> str:
        r, size = self.record, self.size
        return (f"acked {len(r.acked)}, confirmed SUCCESS {len(r.confirmed)}, delivered again after a confirmed SUCCESS "
                f"{len(self.again)} ({sum(x.after_the_end for x in self.again)} after the confirmation), GetSize "
                f"{size.counted} (exact {size.exact}, agreed {size.lag_s:.2f} s after the streams ended) vs drained "
                f"{len(self.drained)}, stranded {len(self.stranded)}, wrong answers {len(r.wrong)}")


def play(enqueue_stub, dequeue_stub, browse_stub, queue: str, seed: int, decided, clients: int = 8,
         seconds: float = 4.0, deadline_s: float = 60.0, min_acked: int = 0) -> Played:
    """Run the adversary on ``queue``, read GetSize once its streams ended, then drain the queue
    until it is empty and ``decided(enqueue_id)`` holds for every acknowledged mail (the mail is
    gone from the view: delivered, or dead), or the deadline."""
    record = Adversary(enqueue_stub, dequeue_stub, queue, seed, clients, seconds, min_acked).run()
    size = sizes(browse_stub, queue)
    undecided = set(record.acked)

    def drained_all() -> bool:
        undecided.difference_update([eid for eid in list(undecided) if decided(eid)])
        return not undecided and browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size == 0

    drained = drain(dequeue_stub, queue, drained_all, deadline_s, record)
    drained_all()
    return Played(record, size, drained, sorted(undecided), after_success(record))


def _seeds(text: str) -> list[int]:
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    """The four services of this checkout as processes on a keyspace of their own (as the tests
    start them), against the running stack (make run); one line of figures per seed."""
    import os

    from stack.harness import drop_keyspace, new_keyspace, stack_env
    from tests.conftest import ProcessSuite
    from tests.inprocess import LoopThread

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-19")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--deadline", type=float, default=90.0)
    a = p.parse_args()
    os.environ.update(stack_env("operator"))
    loop, keyspace = LoopThread(), new_keyspace()
    suite = ProcessSuite(loop, keyspace)
    failed = 0
    try:
        for seed in _seeds(a.seeds):
            queue = suite.new_queue(max_attempts=3)
            decided = lambda eid: suite.run(suite.view.mails.reason(queue, uuid.UUID(eid))) is not None  # noqa: B023, E731
            played = play(suite.enqueue_stub, suite.dequeue_stub, suite.browse_stub, queue, seed, decided,
                          a.clients, a.seconds, a.deadline)
            size = played.size
            failed += bool(played.stranded or played.record.wrong or played.again
                           or not size.counted == size.exact == len(played.drained))
            print(f"seed {seed}: {played}; calls {dict(played.record.calls)}", flush=True)
            for x in played.again[:5]:
                print(f"  {x}", flush=True)
    finally:
        suite.stop()
        loop.stop()
        drop_keyspace(keyspace)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
