"""webhook_svc (``python -m webhook_svc``) on the real event stream and Cassandra, delivering to two
local HTTP receivers: one answers 500, then hangs, then is down, then recovers; the other is healthy throughout.
Every event reaches both, in order, signed; the healthy one is never held up by the failing one;
an event past the maximum age is dropped and counted; the checkpoints are stored, and a restarted
webhook_svc goes on after them."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from services.domain.events import Actor, EventType, of_queue
from stack.harness import ROOT, as_service, free_port, scrape, service_env, wait_until

pytestmark = pytest.mark.integration


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that answers 500 to its first ``failures`` requests, then
    hangs on the next one (no answer until the test ends) if ``hang_then_down``, and meanwhile goes
    down (its port refuses connections) for ``down_s`` before it comes back and answers 200. It
    keeps every request it answered 200 (time, headers, body)."""

    def __init__(self, failures: int = 0, hang_then_down: bool = False, down_s: float = 2.0) -> None:
        self.failures, self.hang_then_down, self.down_s = failures, hang_then_down, down_s
        self.requests, self.refused, self.hung, self.went_down = [], 0, 0, 0
        self.paths: list[str] = []  # each answered request's path, with its query
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.refused < receiver.failures:
                    receiver.refused += 1
                    self.send_response(500)
                elif receiver.hang_then_down and not receiver.hung:
                    receiver.hung += 1
                    threading.Thread(target=receiver.down_then_up).start()
                    receiver.release.wait(60)  # the sender's timeout (1 s) ends the request first
                    return
                else:
                    receiver.requests.append((time.monotonic(), dict(self.headers), body))
                    receiver.paths.append(self.path)
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.handler = Handler
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down_then_up(self) -> None:
        """Stop listening (connections refused) for ``down_s``, then listen again on the same port."""
        self.server.shutdown()
        self.server.server_close()
        self.went_down += 1

        def up() -> None:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
            self.server.serve_forever()

        threading.Timer(self.down_s, up).start()

    def events(self) -> list[dict]:
        return [e for _, _, body in self.requests for e in json.loads(body)]


def metric(port: int, name: str, **labels: str) -> float:
    return scrape(port, name, **labels)


def verified(secret: bytes, headers: dict, body: bytes) -> bool:
    expected = "sha256=" + hmac.new(secret, f"{headers['Mailqueue-Timestamp']}.".encode() + body, hashlib.sha256).hexdigest()
    return headers["Content-Type"] == "application/cloudevents-batch+json" and hmac.compare_digest(
        expected, headers["Mailqueue-Signature"]) and abs(time.time() - int(headers["Mailqueue-Timestamp"])) < 300


@pytest.fixture(scope="module")
def sink(aio_loop, keyspace):
    """The event stream's sink of the session's keyspace (as the EventLog publishes)."""
    from services.adapters.rabbitmq.broker import RabbitMQBroker
    from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
    from services.runtime.settings import rabbitmq_from_env

    settings = rabbitmq_from_env(as_service("browse", service_env(keyspace)))
    broker = RabbitMQBroker(settings, keyspace)
    yield RabbitMQEventStream(broker, keyspace, settings)
    aio_loop.run(broker.close())


def start_webhooks(keyspace: str, endpoints: list[dict], tmp_path, metrics_port: int = 0) -> subprocess.Popen:
    path = tmp_path / f"webhooks-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(endpoints))
    env = as_service("webhook", service_env(keyspace, MAILQUEUE_WEBHOOKS_FILE=str(path), MAILQUEUE_WEBHOOK_BACKOFF_CAP_S="1",
                                              MAILQUEUE_PORT=str(free_port()),
                                              MAILQUEUE_METRICS_PORT=str(metrics_port)))
    return subprocess.Popen([sys.executable, "-m", "webhook_svc"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def killed_once(webhooks: subprocess.Popen, probe, what: str) -> None:  # noqa: ANN001
    """Probe (publishing) until ``probe`` says the endpoints are where the test wants them; then SIGKILL."""
    try:
        wait_until(probe, 60, interval=0.2, what=what)
    finally:
        webhooks.kill()
        webhooks.wait(10)


def published_while_down(aio_loop, sink, queue: str) -> list:  # noqa: ANN001
    """Two events of ``queue``, published while webhook_svc is down."""
    events = [of_queue(EventType.CONFIG_CHANGED, queue, f"down-{i}", actor=Actor.component("test")) for i in range(2)]
    aio_loop.run(sink.publish(events))
    return events


def test_a_failing_endpoint_gets_every_event_once_it_recovers_and_delays_no_other(aio_loop, keyspace, sink, tmp_path):
    queue = f"wh-{uuid.uuid4().hex[:8]}"
    secrets = {}
    for name in ("flaky", "healthy"):
        secrets[name] = os.urandom(32).hex().encode()
        (tmp_path / name).write_bytes(secrets[name])
    flaky, healthy = Receiver(failures=2, hang_then_down=True, down_s=4.0), Receiver()
    endpoints = [{"name": f"{n}-{queue}", "url": r.url, "secret_file": str(tmp_path / n), "queues": [queue], "from_oldest": True,
                  "timeout_s": 1, "max_age_s": 3600} for n, r in (("flaky", flaky), ("healthy", healthy))]
    metrics_port = free_port()
    webhooks = start_webhooks(keyspace, endpoints, tmp_path, metrics_port)
    try:
        sent = [of_queue(EventType.CONFIG_CHANGED, queue, str(i), actor=Actor.component("test")) for i in range(200)]
        stale = of_queue(EventType.CONFIG_CHANGED, queue, "stale", actor=Actor.component("test"),
                         at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2))  # past max_age_s: dropped
        aio_loop.run(sink.publish([stale, *sent[:100]]))
        aio_loop.run(sink.publish(sent[100:]))
        wait_until(lambda: len(healthy.events()) >= 200 and len(flaky.events()) >= 200, 60, what="every event at both endpoints")
        for receiver, name in ((flaky, "flaky"), (healthy, "healthy")):
            assert [e["id"] for e in receiver.events()] == [e.id for e in sent]  # each once, in order
            assert all(verified(secrets[name], headers, body) for _, headers, body in receiver.requests)
        assert (flaky.refused, flaky.hung, flaky.went_down) == (2, 1, 1)
        # The healthy endpoint had everything before the failing one's first success (its third retry).
        assert healthy.requests[-1][0] < flaky.requests[0][0]
        first = flaky.events()[0]
        assert first["type"] == "io.mailqueue.event.config_changed" and first["source"] == f"mailqueue/{queue}"
        assert first["specversion"] == "1.0" and first["data"]["actor"] == {"kind": "component", "role": "", "identity": "test"}
        assert "subject" not in first  # a queue's event: CloudEvents allows no empty subject
        last_cursor = flaky.events()[-1]["data"]["cursor"]
        assert metric(metrics_port, "mailqueue_webhook_events_total", endpoint=endpoints[0]["name"], outcome="too_old") == 1
        # 2 answers 500, 1 timeout (1 s), then connections refused for the 3 s left of the 4 s down:
        # tries at most 1 s apart, so at least one is refused (down 2 s: the try after the timeout
        # and its 1 s backoff met the endpoint back up, 3 retries, on CI)
        assert 4 <= metric(metrics_port, "mailqueue_webhook_retries_total", endpoint=endpoints[0]["name"]) <= 8
    finally:
        flaky.release.set()
        webhooks.kill()
        webhooks.wait(10)

    # Restarted, it goes on after each endpoint's checkpoint: the next event only, nothing again.
    webhooks = start_webhooks(keyspace, endpoints, tmp_path)
    try:
        more = of_queue(EventType.CONFIG_CHANGED, queue, "after-restart", actor=Actor.component("test"))
        aio_loop.run(sink.publish([more]))
        wait_until(lambda: len(flaky.events()) > 200 and len(healthy.events()) > 200, 60, what="the event after the restart")
        assert [e["id"] for e in flaky.events()[200:]] == [e["id"] for e in healthy.events()[200:]] == [more.id]
        assert int(flaky.events()[200]["data"]["cursor"]) > int(last_cursor)
    finally:
        webhooks.kill()
        err = webhooks.communicate(timeout=10)[1].decode()
        flaky.server.shutdown()
        healthy.server.shutdown()
    assert "Traceback" not in err, err[-2000:]


def test_an_endpoint_restarted_before_its_first_answer_misses_nothing(aio_loop, keyspace, sink, tmp_path):
    """An endpoint without from_oldest starts at the next event. Its place is saved with its first
    event, before any answer: webhook_svc killed while the endpoint still fails, and restarted
    after more events came, delivers the first events and those that came while it was down. It
    restarted at "next" before, and both were skipped without a count."""
    queue = f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    late = Receiver(failures=10_000)
    endpoint = {"name": f"late-{queue}", "url": late.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                "timeout_s": 1, "max_age_s": 3600}
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    probes: list = []

    def probe() -> bool:  # events before the endpoint's watch is attached are not its (it starts at "next")
        probes.append(of_queue(EventType.CONFIG_CHANGED, queue, f"probe-{len(probes)}", actor=Actor.component("test")))
        aio_loop.run(sink.publish(probes[-1:]))
        return late.refused >= 2

    killed_once(webhooks, probe, "the endpoint attached, and failing")
    while_down = published_while_down(aio_loop, sink, queue)
    late.failures = 0
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    try:
        wait_until(lambda: [e["id"] for e in late.events()][-2:] == [e.id for e in while_down], 60,
                   what="the events that came while it was down")
        got = [e["id"] for e in late.events()]
        seen = [e.id for e in probes][-(len(got) - 2):]  # the probes from the first one it was sent, in order
        assert 3 <= len(got) and got == seen + [e.id for e in while_down]
    finally:
        webhooks.kill()
        webhooks.wait(10)
        late.server.shutdown()


def test_a_redirect_is_retried_not_followed(aio_loop, keyspace, sink, tmp_path):
    """A POST answered 302 would be followed as a GET without its body to the host the answer
    names (signature headers and all), and that GET's 200 taken for a delivery. It is tried again
    instead, and the events arrive once the endpoint answers 200; the named host is never called."""
    queue = f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    elsewhere, endpoint_receiver = Receiver(), Receiver()
    redirects = {"left": 3}

    class Redirecting(endpoint_receiver.handler):  # type: ignore[name-defined]
        def do_POST(self) -> None:  # noqa: N802
            if redirects["left"] > 0:
                redirects["left"] -= 1
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(302)
                self.send_header("Location", elsewhere.url)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_POST()

    class Answering(elsewhere.handler):  # type: ignore[name-defined]
        def do_GET(self) -> None:  # noqa: N802 - what urllib's redirect sends: answered 200, kept
            elsewhere.requests.append((time.monotonic(), dict(self.headers), b""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    endpoint_receiver.server.RequestHandlerClass = Redirecting
    elsewhere.server.RequestHandlerClass = Answering
    endpoint = {"name": f"moved-{queue}", "url": endpoint_receiver.url, "secret_file": str(tmp_path / "secret"),
                "queues": [queue], "from_oldest": True, "timeout_s": 1, "max_age_s": 3600}
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    try:
        sent = [of_queue(EventType.CONFIG_CHANGED, queue, str(i), actor=Actor.component("test")) for i in range(3)]
        aio_loop.run(sink.publish(sent))
        wait_until(lambda: len(endpoint_receiver.events()) >= 3, 60, what="the events after the redirects")
        assert [e["id"] for e in endpoint_receiver.events()] == [e.id for e in sent] and redirects["left"] == 0
    finally:
        webhooks.kill()
        webhooks.wait(10)
        endpoint_receiver.server.shutdown()
        elsewhere.server.shutdown()
    assert elsewhere.requests == []


def test_a_filtered_endpoint_restarted_before_its_first_wanted_event_misses_nothing(aio_loop, keyspace, sink, tmp_path):
    """An endpoint without from_oldest is placed by the first event it reads, of any type: killed
    before any event it wants came, and restarted after some did, it gets them. Placed only by its
    first wanted event, it started at "next" again and they were skipped without a count."""
    queue, other = f"wh-{uuid.uuid4().hex[:8]}", f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    narrow, witness = Receiver(), Receiver()
    endpoints = [{"name": f"narrow-{queue}", "url": narrow.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                  "timeout_s": 1, "max_age_s": 3600},
                 {"name": f"witness-{other}", "url": witness.url, "secret_file": str(tmp_path / "secret"), "queues": [other],
                  "timeout_s": 1, "max_age_s": 3600}]
    webhooks = start_webhooks(keyspace, endpoints, tmp_path)
    probes: list = []

    def probe() -> bool:  # events the narrow endpoint does not want, until both endpoints read them
        probes.append(of_queue(EventType.CONFIG_CHANGED, other, f"probe-{len(probes)}", actor=Actor.component("test")))
        aio_loop.run(sink.publish(probes[-1:]))
        return len(witness.events()) >= 3  # a few events after both attached: narrow has read (and placed itself at) one

    killed_once(webhooks, probe, "both endpoints reading the stream")
    while_down = published_while_down(aio_loop, sink, queue)
    webhooks = start_webhooks(keyspace, endpoints, tmp_path)
    try:
        wait_until(lambda: len(narrow.events()) >= 2, 60, what="the events it wants that came while it was down")
        assert [e["id"] for e in narrow.events()] == [e.id for e in while_down]
    finally:
        webhooks.kill()
        webhooks.wait(10)
        narrow.server.shutdown()
        witness.server.shutdown()


def test_a_429_with_retry_after_is_tried_again_no_sooner_than_asked(aio_loop, keyspace, sink, tmp_path):
    """The backoff (0.5 s here) would try again at once; the endpoint asked for 3 s."""
    queue = f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    busy = Receiver()
    asked: list[float] = []

    class Busy(busy.handler):  # type: ignore[name-defined]
        def do_POST(self) -> None:  # noqa: N802
            if not asked:
                asked.append(time.monotonic())
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(429)
                self.send_header("Retry-After", "3")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_POST()

    busy.server.RequestHandlerClass = Busy
    endpoint = {"name": f"busy-{queue}", "url": busy.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                "from_oldest": True, "timeout_s": 1, "max_age_s": 3600}
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    try:
        sent = [of_queue(EventType.CONFIG_CHANGED, queue, "busy", actor=Actor.component("test"))]
        aio_loop.run(sink.publish(sent))
        wait_until(lambda: busy.events(), 60, what="the event, once the endpoint took it")
        assert [e["id"] for e in busy.events()] == [sent[0].id]
        waited = busy.requests[0][0] - asked[0]
        assert 3 <= waited < 10, waited
    finally:
        webhooks.kill()
        webhooks.wait(10)
        busy.server.shutdown()


def test_a_checkpoint_past_the_end_of_the_stream_starts_again_at_its_oldest_event(aio_loop, keyspace, sink, tmp_path):
    """A broker reset deletes the event stream, declared again from offset 0: an endpoint's
    checkpoint is then past its end. RabbitMQ attached such a consumer at the end, and every event
    until the new stream's offsets reached the checkpoint's was skipped, without a count. Now the
    endpoint starts again at the oldest event the stream holds: counted and logged."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.domain import event_stream
    from services.runtime.settings import cassandra_from_env

    queue = f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    receiver = Receiver()
    endpoint = {"name": f"reset-{queue}", "url": receiver.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                "timeout_s": 1, "max_age_s": 3600}
    sent = [of_queue(EventType.CONFIG_CHANGED, queue, f"kept-{i}", actor=Actor.component("test")) for i in range(3)]
    for e in sent:  # three messages the stream holds
        aio_loop.run(sink.publish([e]))
    cluster, session = connect(cassandra_from_env(service_env(keyspace)))
    try:  # the checkpoint an endpoint had on the stream before the reset: far past this one's end
        session.execute(f"INSERT INTO {keyspace}.{schema.WEBHOOK_CHECKPOINTS} (endpoint, cursor) VALUES (%s, %s)",
                        (endpoint["name"], event_stream.cursor_of(2**40)))
    finally:
        cluster.shutdown()
    port = free_port()
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path, metrics_port=port)
    try:
        wait_until(lambda: len(receiver.events()) >= 3, 60, what="the events the stream holds, sent")
        assert [e["id"] for e in receiver.events()] == [e.id for e in sent]
        assert metric(port, "mailqueue_webhook_stream_replaced_total", endpoint=endpoint["name"]) == 1
    finally:
        webhooks.kill()
        webhooks.wait(10)
        receiver.server.shutdown()


def test_after_a_stream_reset_a_restart_before_the_first_answer_misses_nothing(aio_loop, keyspace, sink, tmp_path):
    """After a broker reset the endpoint starts again at the stream's oldest event; its old
    checkpoint stayed until the endpoint's first answer. Restarted while the endpoint still failed,
    on a stream grown past that checkpoint by then, webhook_svc resumed at it: every event before
    it skipped, without a count. The checkpoint is placed at the oldest as soon as the reset is seen."""
    import asyncio
    import contextlib

    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.domain import event_stream
    from services.runtime.settings import cassandra_from_env

    queue = f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    receiver = Receiver(failures=10_000)
    endpoint = {"name": f"regrown-{queue}", "url": receiver.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                "timeout_s": 1, "max_age_s": 3600}
    sent = [of_queue(EventType.CONFIG_CHANGED, queue, f"kept-{i}", actor=Actor.component("test")) for i in range(3)]
    for e in sent:
        aio_loop.run(sink.publish([e]))

    async def cursor_of(event_id: str) -> str:
        async with asyncio.timeout(30), contextlib.aclosing(sink.watch(None, from_oldest=True)) as events:
            async for e in events:
                if e.id == event_id:
                    return e.cursor
        raise AssertionError(f"event {event_id} not in the stream")

    end = event_stream.start(aio_loop.run(cursor_of(sent[-1].id))).offset
    cluster, session = connect(cassandra_from_env(service_env(keyspace)))
    try:  # a checkpoint of the stream before the reset: 3 messages past this one's end
        session.execute(f"INSERT INTO {keyspace}.{schema.WEBHOOK_CHECKPOINTS} (endpoint, cursor) VALUES (%s, %s)",
                        (endpoint["name"], event_stream.cursor_of(end + 3)))
    finally:
        cluster.shutdown()
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    killed_once(webhooks, lambda: receiver.refused >= 2, "the endpoint started from the oldest, and failing")
    more = [of_queue(EventType.CONFIG_CHANGED, queue, f"more-{i}", actor=Actor.component("test")) for i in range(6)]
    for e in more:  # the stream grows past the old checkpoint
        aio_loop.run(sink.publish([e]))
    receiver.failures = 0
    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    try:
        wait_until(lambda: len(receiver.events()) >= 9, 60, what="every event of the queue")
        assert [e["id"] for e in receiver.events()] == [e.id for e in sent + more]
    finally:
        webhooks.kill()
        webhooks.wait(10)
        receiver.server.shutdown()


def test_a_filtered_endpoint_moves_its_checkpoint_past_the_events_it_does_not_want(aio_loop, keyspace, sink, tmp_path):
    """An endpoint of one queue's events kept its checkpoint at its last wanted event: a restart
    read again all the stream since, and what retention had removed of it was counted lost and
    logged as an error. Past 1,000 unwanted events in a row, its place moves past them."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.app.webhook_delivery import PASSED_MARK
    from services.runtime.settings import cassandra_from_env

    queue, other = f"wh-{uuid.uuid4().hex[:8]}", f"wh-{uuid.uuid4().hex[:8]}"
    (tmp_path / "secret").write_bytes(os.urandom(16).hex().encode())
    receiver = Receiver()
    endpoint = {"name": f"narrow-{queue}", "url": receiver.url, "secret_file": str(tmp_path / "secret"), "queues": [queue],
                "timeout_s": 1, "max_age_s": 3600, "from_oldest": True}
    wanted = of_queue(EventType.CONFIG_CHANGED, queue, "wanted", actor=Actor.component("test"))
    aio_loop.run(sink.publish([wanted]))
    unwanted = [of_queue(EventType.CONFIG_CHANGED, other, f"n{i}", actor=Actor.component("test")) for i in range(PASSED_MARK + 50)]
    aio_loop.run(sink.publish(unwanted))
    cluster, session = connect(cassandra_from_env(service_env(keyspace)))

    def checkpoint() -> int:
        row = session.execute(f"SELECT cursor FROM {keyspace}.{schema.WEBHOOK_CHECKPOINTS} WHERE endpoint = %s",
                              (endpoint["name"],)).one()
        return int(row.cursor) if row is not None else -1

    webhooks = start_webhooks(keyspace, [endpoint], tmp_path)
    try:
        wait_until(lambda: [e["id"] for e in receiver.events()] == [wanted.id], 60, what="the wanted event delivered")
        sent_at = int(receiver.events()[0]["data"]["cursor"])
        wait_until(lambda: checkpoint() > sent_at, 60, what="the checkpoint past the unwanted events")
    finally:
        webhooks.kill()
        webhooks.wait(10)
        receiver.server.shutdown()
        cluster.shutdown()
