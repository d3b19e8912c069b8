"""Read what the services wrote, straight from the real backends."""

from __future__ import annotations

import datetime as dt

import grpc
import pika

from mailqueue.v1 import enqueue_pb2, mail_pb2
from services.adapters.rabbitmq import message_format
from services.contract import serde
from services.domain import model, names
from services.domain.slices import slices_between
from stack.harness import broker_parameters


def view_rows(suite, queue: str) -> list[model.QueuedMail]:
    """Every row of the queue's view, live or deleted, from browse start to now."""

    async def read() -> list[model.QueuedMail]:
        view = suite.view
        config = await view.config.current()
        start = await view.starts.browse_start(queue)
        rows = []
        for s in slices_between(start, model.utcnow() + dt.timedelta(seconds=1), config.slice_window):
            for b in range(config.bucket_count):
                rows += await view.enqueued.read_slice(queue, s, b)
        return sorted(rows, key=lambda r: r.enqueued_at)

    return suite.run(read())


def deleted_reason(suite, queue: str, enqueue_id) -> str | None:
    return suite.run(suite.view.mails.reason(queue, enqueue_id))


def peek_messages(queue: str) -> list[model.QueuedMail]:
    """The mails of the RabbitMQ messages waiting in the queue's work queue (left in place)."""
    return [mail for mail, _content in peek_contents(queue)]


def peek_contents(queue: str, priority: str = "normal") -> list[tuple[model.QueuedMail, bytes | None]]:
    """(mail, the content the message carries or None) of each message waiting in the queue's
    work queue of that class (left in place)."""
    conn = pika.BlockingConnection(broker_parameters())
    try:
        ch = conn.channel()
        out = []
        while True:
            method, props, body = ch.basic_get(names.work_queue(queue, priority), auto_ack=False)
            if method is None:
                break
            d = message_format.decode(props.headers, body)
            out.append((serde.queued_mail_from_bytes(d.mail_bytes), d.content))
        return out
    finally:
        conn.close()  # unacknowledged messages go back to the queue


def _declared(amqp_queue: str):
    conn = pika.BlockingConnection(broker_parameters())
    try:
        return conn.channel().queue_declare(amqp_queue, passive=True).method
    finally:
        conn.close()


def _ready(amqp_queue: str) -> int:
    return _declared(amqp_queue).message_count


def message_count(queue: str) -> int:
    """Messages ready in the queue's work queue."""
    return _ready(names.work_queue(queue))


def consumer_count(queue: str) -> int:
    """Consumers of the queue's (normal) work queue: a stream's consumer is gone once it is closed."""
    return _declared(names.work_queue(queue)).consumer_count


def delivered(suite, queue: str) -> float:
    """Deliveries dequeue_svc handed to its clients for the queue (mailqueue_delivered_total)."""
    return suite.metric("dequeue", "mailqueue_delivered_total", queue=queue)


def simple_mail(name: str = "m", sender: str = "alice@example.com", recipients=("bob@example.org",)) -> mail_pb2.Mail:
    return mail_pb2.Mail(name=name, sender=sender, recipients=list(recipients))


def inline(queue: str, mail: mail_pb2.Mail, content: bytes = b"Subject: t\r\n\r\nhello\r\n", key: str = ""):
    return enqueue_pb2.EnqueueRequest(queue=queue, mail=mail, inline_content=content, idempotency_key=key)


class StreamConsumer:
    """A Dequeue stream driven from a test: subscribe, receive with a deadline, answer outcomes."""

    def __init__(self, stub, queue: str, prefetch: int = 16, max_batch: int = 0) -> None:
        import queue as q
        import threading

        from mailqueue.v1 import dequeue_pb2

        self._pb = dequeue_pb2
        self._requests: q.Queue = q.Queue()
        self._responses: q.Queue = q.Queue()
        self._requests.put(dequeue_pb2.DequeueRequest(
            subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=prefetch, max_batch=max_batch)))
        self.call = stub.Dequeue(iter(self._requests.get, None))
        self.error = None

        def read() -> None:
            try:
                for response in self.call:
                    self._responses.put(response)
            except Exception as e:  # noqa: BLE001 - kept for the test to inspect
                self.error = e
            self._responses.put(None)

        threading.Thread(target=read, daemon=True).start()
        first = self._responses.get(timeout=30)
        if first is None:
            raise self.error
        assert first.WhichOneof("kind") == "subscribed"
        self.subscribed = first.subscribed

    def response(self, timeout: float = 30):
        """The next DequeueResponse; raises queue.Empty when none arrives within ``timeout``."""
        response = self._responses.get(timeout=timeout)
        if response is None:
            self._responses.put(None)
            raise EOFError(f"stream ended: {self.error}")
        return response

    def next(self, timeout: float = 30):
        """The next Delivery (of a stream that sends them one per message)."""
        return self.response(timeout).delivery

    def take(self, n: int, timeout: float = 30) -> list:
        return [self.next(timeout) for _ in range(n)]

    def answer(self, delivery, kind: str = "SUCCESS", error_message: str = "", retry_after: float | None = None) -> None:
        self._requests.put(self._pb.DequeueRequest(outcome=self.outcome(delivery, kind, error_message, retry_after)))

    def answer_all(self, deliveries, kind: str = "SUCCESS") -> None:
        """One Outcomes message answering every delivery."""
        outcomes = self._pb.Outcomes(outcomes=[self.outcome(d, kind) for d in deliveries])
        self._requests.put(self._pb.DequeueRequest(outcomes=outcomes))

    def outcome(self, delivery, kind: str = "SUCCESS", error_message: str = "", retry_after: float | None = None):
        outcome = self._pb.Outcome(
            delivery_tag=delivery.delivery_tag, kind=getattr(self._pb, f"OUTCOME_KIND_{kind}"), error_message=error_message)
        if retry_after is not None:
            outcome.retry_after.FromTimedelta(dt.timedelta(seconds=retry_after))
        return outcome

    def answer_available(self, delivered) -> None:
        """Answer SUCCESS to every delivery that arrives within 50 ms of the last, counting each
        mail's name in ``delivered`` (a collections.Counter)."""
        import queue as q

        while True:
            try:
                d = self.next(timeout=0.05)
            except q.Empty:
                return
            delivered[d.mail.mail.name] += 1
            self.answer(d)

    def send(self, request) -> None:
        """Any request, as a client could send it."""
        self._requests.put(request)

    def close(self) -> None:
        """Half-close: the server ends the stream; unanswered deliveries go back to the queue."""
        self._requests.put(None)

    def cancel(self) -> None:
        """Break the stream, as a crashed client would."""
        self.call.cancel()


def enqueue_names(suite, queue: str, names, content: bytes = b"Subject: x\r\n\r\nbody") -> list[str]:
    return [suite.enqueue_stub.Enqueue(inline(queue, simple_mail(n), content)).receipt.enqueue_id for n in names]


def fill(suite, queue: str, n: int, prefix: str = "deep") -> list[str]:
    """``n`` mails named ``<prefix>-00000``... in ``queue``, by EnqueueBatches of 250 (one stream)."""
    names = [f"{prefix}-{i:05d}" for i in range(n)]
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(m))) for i, m in enumerate(names)]
    batches = [enqueue_pb2.EnqueueBatchesRequest(mails=many[k:k + 250]) for k in range(0, n, 250)]
    results = [r for b in suite.enqueue_stub.EnqueueBatches(iter(batches), timeout=120) for r in b.results]
    assert len(results) == n and all(r.HasField("receipt") for r in results), results[:3]
    return names


def dead_letter_count(queue: str) -> int:
    """Messages in the queue's dead-letter queue."""
    return _ready(names.dead_letter_queue(queue))


def code_of(fn) -> grpc.StatusCode:
    """The status a call ends with (OK when it returns)."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def heal_counters(suite, queue: str) -> int:
    """The size drift of the queue's counters against the exact count (printed), then reconciled:
    afterwards both agree."""
    from mailqueue.v1 import admin_pb2, browse_pb2

    exact = suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True)).size
    r = suite.admin_stub.ReconcileCounters(admin_pb2.ReconcileCountersRequest(queue=queue))
    assert r.size_after == exact == suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size
    print(f"counter drift: size {r.size_before - exact:+d} (counters {r.size_before}, exact {exact}), healed")
    return r.size_before - exact


def kill_9_mid_stream(stream, process, begun) -> None:
    """Read a streamed admin operation's progress and SIGKILL ``process`` at a random instant once
    ``begun(progress)`` holds, while it goes on; the stream must then end with an error."""
    import random
    import threading

    try:
        for p in stream:
            if begun(p):
                threading.Event().wait(random.uniform(0.005, 0.1))  # choosing the instant, not waiting for a state
                process.kill9()
    except grpc.RpcError:
        return
    raise AssertionError("the stream ended normally: the process was not killed mid-operation")


def one_event_each(suite, queue: str, enqueue_ids, types=("ENQUEUED", "DELIVERED"), timeout: float = 60,
                   others: bool = False) -> tuple[int, int]:
    """DESIGN §11's "nothing missing": each mail has exactly one event of each of ``types`` (by id)
    in its history (GetMailHistory) and in the event stream (WatchEvents from the oldest, filtered
    by the queue on the server). A change carried out twice (a redelivered mail answered again)
    writes the same id: counted once. No other mail of the queue has such an event unless
    ``others``. Returns (stream messages that repeated an id, other mails with events)."""
    from mailqueue.v1 import events_pb2, events_pb2_grpc

    stub = events_pb2_grpc.EventServiceStub(suite.browse.channel())
    wanted = [events_pb2.EventType.Value(f"EVENT_TYPE_{t}") for t in types]
    ids = set(enqueue_ids)
    for eid in ids:
        events = stub.GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=eid), timeout=30).events
        for t in wanted:
            found = {e.id for e in events if e.type == t}
            assert len(found) == 1, (eid, events_pb2.EventType.Name(t), [(e.type, e.id) for e in events])
    seen: dict[tuple[str, int], set[str]] = {}
    repeated = 0
    call = stub.WatchEvents(events_pb2.WatchEventsRequest(from_oldest=True, queues=[queue], types=wanted), timeout=timeout)
    try:
        for r in call:
            key = (r.event.enqueue_id, r.event.type)
            repeated += r.event.id in seen.get(key, set())
            seen.setdefault(key, set()).add(r.event.id)
            if all((eid, t) in seen for eid in ids for t in wanted):
                break
    finally:
        call.cancel()
    missing = [(eid, t) for eid in ids for t in wanted if (eid, t) not in seen]
    assert not missing, f"{len(missing)} events missing from the stream, e.g. {missing[:5]}"
    assert all(len(v) == 1 for v in seen.values()), [k for k, v in seen.items() if len(v) > 1][:5]
    other = {k[0] for k in seen} - ids
    assert others or not other, f"events of {len(other)} mails never delivered, e.g. {sorted(other)[:5]}"
    return repeated, len(other)


def first_queue_event(suite, queue: str, kind: int, timeout: float = 20):
    """The first event of ``kind`` about ``queue`` in the event stream (WatchEvents from the oldest)."""
    from mailqueue.v1 import events_pb2, events_pb2_grpc

    call = events_pb2_grpc.EventServiceStub(suite.browse.channel()).WatchEvents(
        events_pb2.WatchEventsRequest(from_oldest=True, queues=[queue], types=[kind]), timeout=timeout)
    try:
        return next(iter(call)).event
    finally:
        call.cancel()
