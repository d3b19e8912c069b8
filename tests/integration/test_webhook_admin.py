"""Webhook endpoints registered through WebhookAdminService (gRPC, and the installed ``mailq``
entry point): bad input gets a precise status and writes nothing (no registration, no event);
webhook_svc serves health, reflection and metrics, starts delivering to an endpoint added while
it runs, stops when it is removed, and resumes after its checkpoint when it is added again."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import uuid

import grpc
import pytest
from google.protobuf import duration_pb2

from mailqueue.v1 import events_pb2, events_pb2_grpc, webhooks_pb2, webhooks_pb2_grpc
from services.domain.events import Actor, EventType, of_queue
from stack.harness import ROOT, as_service, free_port, is_serving, listed_services, scrape, service_env, wait_until
from tests.integration.test_webhooks import Receiver, sink, verified  # noqa: F401 - sink: the fixture

pytestmark = pytest.mark.integration

MAILQ = pathlib.Path(sys.executable).parent / "mailq"


def mailq(target: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """The installed entry point, from another directory (PYTHONPATH: this checkout's code, as a fresh clone's install has)."""
    r = subprocess.run([str(MAILQ), "--browse", target, "webhook", *args], cwd=tempfile.gettempdir(), capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert (r.returncode == 0) is ok, r.stderr
    return r


def code(call) -> grpc.StatusCode:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()


def stopped(webhooks: subprocess.Popen, receiver: Receiver) -> str:
    """Stop webhook_svc (SIGTERM: it ends cleanly) and the receiver; what webhook_svc logged."""
    webhooks.send_signal(signal.SIGTERM)
    err = webhooks.communicate(timeout=30)[1].decode()
    receiver.server.shutdown()
    assert webhooks.returncode == 0, err[-2000:]
    return err


def test_bad_registrations_get_a_precise_status_and_write_nothing(suite, tmp_path):
    stub = webhooks_pb2_grpc.WebhookAdminServiceStub(suite.browse.channel())
    prefix = f"bad-{uuid.uuid4().hex[:6]}"

    def add(**fields):  # noqa: ANN003, ANN202
        w = webhooks_pb2.Webhook(**{"name": f"{prefix}-ok", "url": "https://hooks.example/in", "secret_file": "/secrets/x", **fields})
        return lambda: stub.AddWebhook(webhooks_pb2.AddWebhookRequest(webhook=w))

    assert code(add(name="")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(name=f"{prefix} space")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(url="ftp://hooks.example/in")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(url="hooks.example/in")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(secret_file="relative/x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(event_types=[0])) == grpc.StatusCode.INVALID_ARGUMENT  # unspecified
    assert code(add(event_types=[999])) == grpc.StatusCode.INVALID_ARGUMENT  # unknown
    # each taken before, then failing at every POST (or INTERNAL at once), or matching nothing
    for url in ("http://[::1/x", "http://h:99999/x", "http://user:pw@hooks.example/in", "https://hooks.example/in#f",
                "http://hooks.example/x\r\nX: y", "http://a b/", "https://hooks.example/" + "x" * 2000):
        assert code(add(url=url)) == grpc.StatusCode.INVALID_ARGUMENT, url
    assert code(add(secret_file="/secrets/x\x00y")) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(add(queues=["!!bad"])) == grpc.StatusCode.INVALID_ARGUMENT
    for nanos in (1, 500_000_000):  # under a second every event would be dropped (1 ns became the 1-day default)
        assert code(add(max_age=duration_pb2.Duration(nanos=nanos))) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda: stub.AddWebhook(webhooks_pb2.AddWebhookRequest())) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda: stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=f"{prefix}-none"))) == grpc.StatusCode.NOT_FOUND
    assert [w.name for w in stub.ListWebhooks(webhooks_pb2.ListWebhooksRequest()).webhooks if w.name.startswith(prefix)] == []

    added = stub.AddWebhook(webhooks_pb2.AddWebhookRequest(webhook=webhooks_pb2.Webhook(
        name=f"{prefix}-ok", url="https://hooks.example/in", secret_file="/secrets/x",
        event_types=[events_pb2.EVENT_TYPE_DELIVERED], queues=["a"]))).webhook
    assert added.created_at.seconds > 0 and added.max_age.seconds == 86400
    assert code(add(url="https://other.example/")) == grpc.StatusCode.ALREADY_EXISTS
    listed = [w for w in stub.ListWebhooks(webhooks_pb2.ListWebhooksRequest()).webhooks if w.name.startswith(prefix)]
    assert listed == [added]  # the second add changed nothing

    # The audit trail: one CONFIG_CHANGED for the add (none for the refused calls), then one for the remove.
    stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=f"{prefix}-ok"))
    events = events_pb2_grpc.EventServiceStub(suite.browse.channel())
    seen = []
    watch = events.WatchEvents(events_pb2.WatchEventsRequest(from_oldest=True, types=[events_pb2.EVENT_TYPE_CONFIG_CHANGED]), timeout=30)
    for r in watch:
        if r.event.details.get("webhook", "").startswith(prefix):
            seen.append((r.event.details["webhook"], r.event.details["change"], r.event.details.get("url", "")))
            if len(seen) == 2:
                watch.cancel()
                break
    assert seen == [(f"{prefix}-ok", "added", "https://hooks.example/in"), (f"{prefix}-ok", "removed", "")]
    assert code(lambda: stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=f"{prefix}-ok"))) == grpc.StatusCode.NOT_FOUND


def test_a_registration_naming_event_types_of_a_newer_version_is_served_with_those_this_one_knows(suite):
    """During a rolling update a newer browse_svc may register event types this version does not
    know: one such row failed every read of the registrations (ListWebhooks INTERNAL, webhook_svc
    delivering to no endpoint at all). The types it knows are served; a row of unknown types only
    is left out (its filter would be empty: every event), and can still be removed."""
    from services.adapters.cassandra import schema

    stub = webhooks_pb2_grpc.WebhookAdminServiceStub(suite.browse.channel())
    mixed, only = (f"newer-{uuid.uuid4().hex[:6]}-{k}" for k in ("mixed", "only"))
    table = f"{suite.keyspace}.{schema.WEBHOOKS}"
    insert = (f"INSERT INTO {table} (part, name, url, secret_file, types, queues, max_age_s, from_oldest) "
              "VALUES (0, %s, 'https://hooks.example/in', '/secrets/x', %s, [], 3600, false)")
    suite.view.session.execute(insert, (mixed, ["delivered", "teleported"]))
    suite.view.session.execute(insert, (only, ["teleported"]))
    try:
        listed = {w.name: w for w in stub.ListWebhooks(webhooks_pb2.ListWebhooksRequest(), timeout=30).webhooks}
        assert mixed in listed and only not in listed
        assert list(listed[mixed].event_types) == [events_pb2.EVENT_TYPE_DELIVERED]
        assert stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=only), timeout=30).webhook.name == only
        assert stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=mixed), timeout=30).webhook.name == mixed
    finally:
        for name in (mixed, only):
            suite.view.session.execute(f"DELETE FROM {table} WHERE part = 0 AND name = %s", (name,))


def test_adds_of_one_name_at_once_register_one_and_record_one(suite):
    """Eight AddWebhook calls of one name at once: one registers it, seven are ALREADY_EXISTS, and
    the audit trail has one "added" (the winner's). The refused calls recorded theirs too, when
    they all passed the name check before any insert."""
    import threading

    stub = webhooks_pb2_grpc.WebhookAdminServiceStub(suite.browse.channel())
    name = f"race-{uuid.uuid4().hex[:6]}"
    start, answers = threading.Barrier(8), {}

    def add(i: int) -> None:
        start.wait()
        w = webhooks_pb2.Webhook(name=name, url=f"https://hooks.example/{i}", secret_file="/secrets/x")
        try:
            answers[i] = stub.AddWebhook(webhooks_pb2.AddWebhookRequest(webhook=w)).webhook.url
        except grpc.RpcError as e:
            answers[i] = e.code()

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    won = [a for a in answers.values() if isinstance(a, str)]
    assert len(won) == 1 and sorted(str(a) for a in answers.values() if not isinstance(a, str)) == [str(grpc.StatusCode.ALREADY_EXISTS)] * 7
    stub.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=name))  # the end of what to read
    seen = []
    watch = events_pb2_grpc.EventServiceStub(suite.browse.channel()).WatchEvents(
        events_pb2.WatchEventsRequest(from_oldest=True, types=[events_pb2.EVENT_TYPE_CONFIG_CHANGED]), timeout=30)
    for r in watch:
        if r.event.details.get("webhook") == name:
            seen.append((r.event.details["change"], r.event.details.get("url", "")))
            if seen[-1][0] == "removed":
                watch.cancel()
                break
    assert seen == [("added", won[0]), ("removed", "")]


def test_webhook_svc_follows_the_registrations_and_serves_health(aio_loop, suite, sink, tmp_path):  # noqa: F811
    queue, name = f"wha-{uuid.uuid4().hex[:8]}", f"live-{uuid.uuid4().hex[:6]}"
    secret = os.urandom(32).hex().encode()
    (tmp_path / "secret").write_bytes(secret)
    receiver = Receiver()
    port, metrics_port = free_port(), free_port()
    env = as_service("webhook", service_env(suite.keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(metrics_port),
                                           MAILQUEUE_WEBHOOK_RELOAD_S="0.5", MAILQUEUE_WEBHOOK_BACKOFF_CAP_S="1"))
    webhooks = subprocess.Popen([sys.executable, "-m", "webhook_svc"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = f"127.0.0.1:{port}"

    def endpoints() -> float:
        return scrape(metrics_port, "mailqueue_webhook_endpoints")

    try:
        wait_until(lambda: is_serving(target), 60, 0.2, what="webhook_svc SERVING")
        assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= listed_services(target)
        assert scrape(metrics_port, "mailqueue_serving") == 1 and endpoints() == 0

        added = mailq(suite.browse.target, "add", name, receiver.url, "--secret-file", str(tmp_path / "secret"),
                      "--queues", queue, "--events", "config_changed", "--from-oldest").stdout
        assert f"added webhook {name}: {receiver.url}" in added
        assert name in mailq(suite.browse.target, "list").stdout
        wait_until(lambda: endpoints() == 1, 20, 0.1, what="the endpoint started")
        first = [of_queue(EventType.CONFIG_CHANGED, queue, f"a{i}", actor=Actor.component("test")) for i in range(5)]
        aio_loop.run(sink.publish(first))
        wait_until(lambda: len(receiver.events()) >= 5, 30, what="the first events delivered")
        assert [e["id"] for e in receiver.events()] == [e.id for e in first]
        assert all(verified(secret, headers, body) for _, headers, body in receiver.requests)

        assert f"removed webhook {name}" in mailq(suite.browse.target, "remove", name).stdout
        wait_until(lambda: endpoints() == 0, 20, 0.1, what="the endpoint stopped")
        later = [of_queue(EventType.CONFIG_CHANGED, queue, f"b{i}", actor=Actor.component("test")) for i in range(3)]
        aio_loop.run(sink.publish(later))
        assert "NOT_FOUND" in mailq(suite.browse.target, "remove", name, ok=False).stderr

        # Added again: it resumes after its checkpoint (the events published meanwhile, nothing twice).
        mailq(suite.browse.target, "add", name, receiver.url, "--secret-file", str(tmp_path / "secret"), "--queues", queue)
        wait_until(lambda: len(receiver.events()) >= 8, 30, what="the events published while it was removed")
        assert [e["id"] for e in receiver.events()] == [e.id for e in first + later]
        assert "ALREADY_EXISTS" in mailq(suite.browse.target, "add", name, receiver.url, "--secret-file", "/x", ok=False).stderr
        assert "INVALID_ARGUMENT" in mailq(suite.browse.target, "add", "x", "ftp://h/", "--secret-file", "/x", ok=False).stderr
        mailq(suite.browse.target, "remove", name)
    finally:
        err = stopped(webhooks, receiver)
    assert "Traceback" not in err, err[-2000:]


def test_secret_files_are_confined_and_a_url_token_is_shown_nowhere(aio_loop, suite, sink, tmp_path):  # noqa: F811
    """A registration names the path webhook_svc reads its secret from: /dev/zero was read for ever
    on its event loop (every endpoint stopped, the pod's memory filled), and any file it may read
    (a service credential) could be named. With MAILQUEUE_WEBHOOK_SECRETS_DIR only regular files
    inside it are read; such registrations are skipped (logged), the others delivered. A token in
    the URL's query reached the CONFIG_CHANGED event (readers and other webhooks see it), the
    listing and the logs: masked there, sent as registered."""
    queue, token = f"whs-{uuid.uuid4().hex[:8]}", f"s3cret{uuid.uuid4().hex}"
    secrets, outside = tmp_path / "secrets", tmp_path / "credential"
    secrets.mkdir()
    secret = os.urandom(32).hex().encode()
    (secrets / "..data").mkdir()  # a mounted Secret's own links: NAME -> ..data/NAME
    (secrets / "..data" / "good").write_bytes(secret)
    (secrets / "good").symlink_to("..data/good")
    outside.write_bytes(b"cassandra-password")
    (secrets / "out").symlink_to(outside)
    receiver = Receiver()
    port, metrics_port = free_port(), free_port()
    env = as_service("webhook", service_env(suite.keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(metrics_port),
                                           MAILQUEUE_WEBHOOK_RELOAD_S="0.5", MAILQUEUE_WEBHOOK_SECRETS_DIR=str(secrets)))
    webhooks = subprocess.Popen([sys.executable, "-m", "webhook_svc"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target, names = f"127.0.0.1:{port}", [f"{n}-{uuid.uuid4().hex[:6]}" for n in ("good", "zero", "out", "far")]
    try:
        wait_until(lambda: is_serving(target), 60, 0.2, what="webhook_svc SERVING")
        for name, path in zip(names, [secrets / "good", "/dev/zero", secrets / "out", outside], strict=True):
            mailq(suite.browse.target, "add", name, f"{receiver.url}?token={token}&v=1", "--secret-file", str(path),
                  "--queues", queue, "--events", "config_changed")
        listing = mailq(suite.browse.target, "list").stdout
        assert names[0] in listing and token not in listing and "?token=…&v=…" in listing, listing
        wait_until(lambda: scrape(metrics_port, "mailqueue_webhook_endpoints") == 1, 20, 0.1, what="the good endpoint started")
        first = [of_queue(EventType.CONFIG_CHANGED, queue, f"c{i}", actor=Actor.component("test")) for i in range(3)]
        aio_loop.run(sink.publish(first))
        wait_until(lambda: len(receiver.events()) >= 3, 30, what="the events delivered to the good endpoint")
        assert all(verified(secret, headers, body) for _, headers, body in receiver.requests)
        assert all(p == f"/hook?token={token}&v=1" for p in receiver.paths), receiver.paths  # sent as registered
        assert is_serving(target) and scrape(metrics_port, "mailqueue_webhook_endpoints") == 1
        # The registrations' CONFIG_CHANGED events (install-level: every reader may watch them) hold no token.
        watch = events_pb2_grpc.EventServiceStub(suite.browse.channel()).WatchEvents(events_pb2.WatchEventsRequest(
            from_oldest=True, types=[events_pb2.EVENT_TYPE_CONFIG_CHANGED]), timeout=30)
        recorded = []
        for r in watch:
            if r.event.details.get("webhook") in names and r.event.details.get("change") == "added":
                recorded.append(r.event)
            if len(recorded) == len(names):
                break
        watch.cancel()
        assert all(token not in str(e) and "token=…" in e.details["url"] for e in recorded), recorded
        for name in names:
            mailq(suite.browse.target, "remove", name)
    finally:
        err = stopped(webhooks, receiver)
    assert token not in err and "cassandra-password" not in err, err[-2000:]
    assert "is not a regular file" in err and err.count("is outside MAILQUEUE_WEBHOOK_SECRETS_DIR") >= 2, err[-3000:]


def test_webhook_svc_is_alive_but_not_ready_while_cassandra_does_not_answer(keyspace, tmp_path):
    """Readiness NOT_SERVING (out of a Service, not restarted), liveness SERVING, while its backend is unreachable."""
    from grpc_health.v1 import health_pb2

    from stack.harness import health

    port, log = free_port(), tmp_path / "webhook.log"
    env = {**as_service("browse", service_env(keyspace, MAILQUEUE_PORT=str(port))), "MAILQUEUE_CASSANDRA_PORT": str(free_port())}
    with open(log, "wb") as err:
        webhooks = subprocess.Popen([sys.executable, "-m", "webhook_svc"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    target = f"127.0.0.1:{port}"
    try:
        # After its first failed connection (logged), it answers: alive, not ready.
        wait_until(lambda: "not serving: cassandra unavailable" in log.read_text(), 30, 0.1, what="a failed connection logged")
        assert health(target, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert health(target) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        webhooks.send_signal(signal.SIGTERM)
        webhooks.wait(30)
    assert webhooks.returncode == 0, log.read_text()[-2000:]  # SIGTERM while still connecting: a clean stop
