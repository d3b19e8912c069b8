"""Every service serves health and reflection; a real process reports NOT_SERVING, then SERVING."""

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from grpc_health.v1 import health_pb2

from stack.harness import ROOT, free_port, health, listed_services, service_env, wait_until

EXPECTED = {
    "enqueue": "mailqueue.v1.EnqueueService",
    "dequeue": "mailqueue.v1.DequeueService",
    "browse": "mailqueue.v1.BrowseService",
    "blob": "mailqueue.v1.BlobService",
}






@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_service_is_serving_and_reflects_its_services(suite, name):
    app = getattr(suite, name)
    assert health(app.target) == health_pb2.HealthCheckResponse.SERVING
    assert health(app.target, EXPECTED[name]) == health_pb2.HealthCheckResponse.SERVING
    services = listed_services(app.target)
    assert {EXPECTED[name], "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    if name == "browse":
        assert "mailqueue.v1.AdminService" in services


def start_process(module: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_a_service_process_is_not_serving_until_its_backends_answer(keyspace):
    # Given Cassandra unreachable (a closed port), the process listens and says NOT_SERVING, without crashing:
    # readiness fails (the "" service, the service's own name), liveness ("liveness") does not.
    port, metrics, dead = free_port(), free_port(), free_port()
    env = service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(metrics),
                      MAILQUEUE_CASSANDRA_PORT=str(dead), MAILQUEUE_CASSANDRA_TIMEOUT_S="1")
    proc = start_process("enqueue_svc", env)
    try:
        target = f"127.0.0.1:{port}"
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.NOT_SERVING, 30, what="NOT_SERVING")
        assert health(target, "mailqueue.v1.EnqueueService") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health(target, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert proc.poll() is None
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert "mailqueue_serving 0.0" in body
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("held", ["MAILQUEUE_PORT", "MAILQUEUE_METRICS_PORT"])
def test_a_port_another_process_holds_refuses_start_up_naming_it(keyspace, held):
    """Exit 2 and one line naming the variable and the address, like any configuration refused
    (it was exit 1 with grpc's or http.server's traceback, naming no variable)."""
    import socket

    port, metrics = free_port(), free_port()
    env = service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(metrics))
    taken = port if held == "MAILQUEUE_PORT" else metrics
    with socket.socket() as other:  # a listener without SO_REUSEPORT: the port is taken
        other.bind(("127.0.0.1", taken))
        other.listen()
        proc = start_process("enqueue_svc", env)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert f"refusing to start: {held}={taken}: cannot listen on 127.0.0.1:{taken}" in err, err
    assert "Traceback" not in err, err


def test_a_refused_rabbitmq_login_is_named_as_such_with_what_to_check(keyspace, running_stack, tmp_path):
    # Given a service whose RabbitMQ password file is wrong (a Secret rotated on one side only)
    import shutil

    env = service_env(keyspace, MAILQUEUE_PORT=str(free_port()), MAILQUEUE_METRICS_PORT=str(free_port()))
    credentials = tmp_path / "credentials"
    shutil.copytree(env["MAILQUEUE_CREDENTIALS_DIR"], credentials)
    (credentials / "rabbitmq-password").write_text("not-the-password\n")
    log = tmp_path / "enqueue.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "enqueue_svc"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                env={**env, "MAILQUEUE_CREDENTIALS_DIR": str(credentials)})
    try:
        # Then it is not serving, and says the login was refused and where the credential comes from
        # (it said "no RabbitMQ node answered", as if the broker were down)
        wait_until(lambda: "RabbitMQ refused the login of user" in log.read_text(), 60, what="the refusal logged")
        said = log.read_text()
        assert "rabbitmq-password files of MAILQUEUE_CREDENTIALS_DIR" in said and "no RabbitMQ node answered" not in said
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_a_service_process_serves_once_the_stack_is_up(keyspace, running_stack):
    port, metrics = free_port(), free_port()
    env = service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(metrics), MAILQUEUE_LOG_LEVL="DEBUG")
    proc = start_process("blob_svc", env)
    try:
        target = f"127.0.0.1:{port}"
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.SERVING, 60, what="SERVING")
        assert health(target, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert "mailqueue.v1.BlobService" in listed_services(target)
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        assert "mailqueue_serving 1.0" in body and "mailqueue_rpc_total" in body
        # A second copy on its port is refused: grpc's SO_REUSEPORT would hand it half the connections
        second = start_process("blob_svc", {**env, "MAILQUEUE_METRICS_PORT": str(free_port())})
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2, err
        assert f"refusing to start: MAILQUEUE_PORT={port}: cannot listen on 127.0.0.1:{port}" in err, err
        assert health(target) == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # A misspelled variable is named at start-up with the one it would have set (it used to be ignored, silently)
    assert "MAILQUEUE_LOG_LEVL is set but not read: did you mean MAILQUEUE_LOG_LEVEL?" in err, err
    # Every line is JSON, the warnings said before the server starts included (plain text before)
    said = [json.loads(line) for line in err.splitlines()]
    assert {"serving gRPC in the clear (MAILQUEUE_PLAINTEXT=true, loopback only)", "stopped"} <= {e["msg"] for e in said}
    assert {e["service"] for e in said} == {"blob"}


def test_a_violating_view_configuration_refuses_start_up(running_stack):
    # Given a stored configuration with 2 buckets, when a process is configured with 1, it refuses to start.
    from stack.harness import new_keyspace

    keyspace = new_keyspace()
    first = start_process("browse_svc", service_env(keyspace, MAILQUEUE_PORT=str(free_port()), MAILQUEUE_BUCKET_COUNT="2"))
    try:
        wait_until(lambda: _stored_buckets(keyspace) == 2, 60, interval=0.5, what="stored configuration")
    finally:
        first.kill()
        first.wait()
    second = start_process("browse_svc", service_env(keyspace, MAILQUEUE_PORT=str(free_port()), MAILQUEUE_BUCKET_COUNT="1"))
    try:
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert "bucket_count may only grow" in err
    finally:
        from tests.conftest import drop_keyspace

        drop_keyspace(keyspace)


def _stored_buckets(keyspace: str) -> int | None:
    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    cluster, session = connect(cassandra_from_env())
    try:
        try:
            row = session.execute(f"SELECT bucket_count FROM {keyspace}.queue_view_config_events_v1 LIMIT 1").one()
        except Exception:  # the table does not exist yet
            return None
        return row.bucket_count if row else None
    finally:
        cluster.shutdown()


def test_sigterm_with_a_lameduck_goes_not_serving_keeps_answering_then_exits(keyspace, running_stack):
    """MAILQUEUE_LAMEDUCK_S (the manifests: 35 s): after SIGTERM the process says NOT_SERVING at once
    (readiness; liveness stays SERVING), still answers RPCs for the lameduck (its API's health name
    SERVING until its end, then NOT_SERVING for a second), then drains and exits 0."""
    import signal
    import time

    import grpc

    from mailqueue.v1 import enqueue_pb2, enqueue_pb2_grpc

    port = free_port()
    env = service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_LAMEDUCK_S="3")
    proc = start_process("enqueue_svc", env)
    target = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.SERVING, 60, what="SERVING")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.NOT_SERVING, 5, what="NOT_SERVING after SIGTERM")
        assert health(target, "liveness") == health_pb2.HealthCheckResponse.SERVING
        # The API's own name stays SERVING through the lameduck (clients that watch it keep calling
        # here), and turns NOT_SERVING before the connections close (they leave first).
        assert health(target, "mailqueue.v1.EnqueueService") == health_pb2.HealthCheckResponse.SERVING
        stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(target))
        with pytest.raises(grpc.RpcError) as e:  # answered (refused as bad input), not UNAVAILABLE
            stub.Enqueue(enqueue_pb2.EnqueueRequest(queue="q"), timeout=5)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and proc.poll() is None
        wait_until(lambda: health(target, "mailqueue.v1.EnqueueService") == health_pb2.HealthCheckResponse.NOT_SERVING, 10,
                   what="the API's name NOT_SERVING at the end of the lameduck")
        assert time.monotonic() - sent >= 2.5
        assert proc.wait(20) == 0
        assert time.monotonic() - sent >= 2.5  # it kept serving for the lameduck
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_of_dequeue_svc_writes_the_hand_outs_its_open_streams_hold(suite):
    """A graceful stop (a rolling update) loses no event: the streams cancelled at the end of the
    grace give back their deliveries and write the HANDED_OUT events they still hold before the
    process closes its backends (dequeue_svc/app.py, ``Dequeuer.drain``)."""
    import signal

    import grpc

    from mailqueue.v1 import dequeue_pb2_grpc, events_pb2, events_pb2_grpc
    from tests.integration.helpers import StreamConsumer, enqueue_names

    # Given a dequeue_svc process whose hand-out events wait a minute for their answers, and a
    # consumer holding a batch of its deliveries unanswered
    port = free_port()
    env = service_env(suite.keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_HANDOUT_EVENT_DELAY_MS="60000",
                      MAILQUEUE_SHUTDOWN_GRACE_S="1", MAILQUEUE_LAMEDUCK_S="0")
    proc = start_process("dequeue_svc", env)
    target = f"127.0.0.1:{port}"
    queue = suite.new_queue()
    enqueue_names(suite, queue, [f"m-{i}" for i in range(150)])  # more than one batch: some to give back at the stop
    consumer = None
    try:
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.SERVING, 60, what="SERVING")
        consumer = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(target)), queue,
                                  prefetch=128, max_batch=64)
        handed = [d.mail.enqueue_id for d in consumer.response().deliveries.deliveries]
        eid = handed[0]

        def history() -> list[str]:
            events = events_pb2_grpc.EventServiceStub(suite.browse.channel()).GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=eid)).events
            return [events_pb2.EventType.Name(e.type) for e in events]

        assert history() == ["EVENT_TYPE_ENQUEUED"]  # held, not written
        # When the client leaves and the process is stopped with SIGTERM at once
        consumer.cancel()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()[-2000:] if proc.stderr else ""
        # Then the hand-out is in the history, and the process logged no lost event
        assert history() == ["EVENT_TYPE_ENQUEUED", "EVENT_TYPE_HANDED_OUT"]
        assert "hand-out events lost" not in (proc.stderr.read() if proc.stderr else "")
    finally:
        if consumer is not None:
            consumer.close()
        if proc.poll() is None:
            proc.kill()


def test_sigterm_of_dequeue_svc_hands_out_nothing_more_and_ends_each_stream_once_answered(suite):
    """A graceful stop (a rolling update) sends no mail twice: after SIGTERM a consumer's stream
    hands out nothing more, its answers are carried out, and it ends UNAVAILABLE ("subscribe
    again") once answered; cut at the end of the grace instead, the deliveries it held came back."""
    import queue as queue_module
    import signal

    import grpc

    from mailqueue.v1 import dequeue_pb2_grpc
    from tests.integration.helpers import StreamConsumer, enqueue_names

    # Given a dequeue_svc process with a grace of 20 s, and a consumer holding 4 deliveries
    port = free_port()
    env = service_env(suite.keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_SHUTDOWN_GRACE_S="20", MAILQUEUE_LAMEDUCK_S="0")
    proc = start_process("dequeue_svc", env)
    target = f"127.0.0.1:{port}"
    queue = suite.new_queue()
    names = [f"g-{i}" for i in range(12)]
    enqueue_names(suite, queue, names)
    consumer = None
    try:
        wait_until(lambda: health(target) == health_pb2.HealthCheckResponse.SERVING, 60, what="SERVING")
        consumer = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(target)), queue, prefetch=4)
        held = [consumer.next() for _ in range(4)]
        # When the process is stopped with SIGTERM, and the consumer then answers what it holds
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: health(target) != health_pb2.HealthCheckResponse.SERVING, 10, what="NOT_SERVING after SIGTERM")
        for d in held:
            consumer.answer(d)
        # Then nothing more is handed out, and the stream ends at once, UNAVAILABLE, saying to subscribe again
        with pytest.raises(EOFError):
            extra = consumer.next(timeout=15)
            pytest.fail(f"handed out after SIGTERM: {extra.mail.mail.name}")
        assert consumer.error.code() == grpc.StatusCode.UNAVAILABLE and "subscribe again" in consumer.error.details()
        assert proc.wait(30) == 0
        assert time.monotonic() - stopped < 15, "the stop waited for the whole grace"
        # and the other mails are delivered once each by the queue's own dequeue_svc, none of the answered again
        rest = StreamConsumer(suite.dequeue_stub, queue, prefetch=16)
        got = [rest.next() for _ in range(8)]
        for d in got:
            rest.answer(d)
        assert sorted(d.mail.mail.name for d in got) == sorted(set(names) - {d.mail.mail.name for d in held})
        with pytest.raises(queue_module.Empty):
            rest.next(timeout=1)  # none of the answered ones comes again
        rest.close()
    finally:
        if consumer is not None:
            consumer.close()
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("variable, value", [("MAILQUEUE_WEBHOOK_RELOAD_S", "abc"), ("MAILQUEUE_WEBHOOK_BACKOFF_CAP_S", "0")])
def test_a_bad_webhook_svc_setting_refuses_start_up_in_one_line(keyspace, variable, value):
    """webhook_svc's own settings are read as its app is built: a bad one was a traceback (exit 1,
    and a crash loop), not the one line and exit 2 of every other refused setting."""
    proc = start_process("webhook_svc", service_env(keyspace, **{variable: value}))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert f"refusing to start: {variable}=" in err and "Traceback" not in err, err
