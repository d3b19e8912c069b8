"""The dev overlay in real containers (podman kube play), driven through the pods as clients do."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
import uuid

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from tests.deploy import pods
from tests.deploy.conftest import NOT_SERVING, SERVING, Deployed
from tests.harness import ROOT, health, listed_services, stack, wait_until
from tests.load import Load

SERVICE_NAMES = {
    "enqueue": "mailqueue.v1.EnqueueService",
    "dequeue": "mailqueue.v1.DequeueService",
    "browse": "mailqueue.v1.BrowseService",
    "blob": "mailqueue.v1.BlobService",
}
GO = os.path.join(ROOT, "tests", "contract", "go")




def test_every_pod_serves_health_reflection_and_metrics(deployed: Deployed):
    assert sorted(deployed.rendered.targets) == sorted(SERVICE_NAMES)
    assert len(deployed.rendered.targets["enqueue"]) == 2
    for component, targets in deployed.rendered.targets.items():
        for target, metrics in zip(targets, deployed.rendered.metrics[component]):
            assert health(target) == SERVING, target
            assert health(target, SERVICE_NAMES[component]) == SERVING, target
            assert health(target, "liveness") == SERVING, target
            assert SERVICE_NAMES[component] in listed_services(target)
            body = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
            assert "mailqueue_serving 1.0" in body, metrics
    # Every replica came up well within its start-up probe's budget (60 x 2 s).
    assert max(deployed.start_s.values()) < 60, deployed.start_s


def test_the_services_run_as_uid_10001_with_the_security_context_the_manifests_ask_for(deployed: Deployed):
    for component in SERVICE_NAMES:
        for name in deployed.containers(component):
            c = pods.inspect(name)
            assert c["Config"]["User"] == "10001:10001", name
            assert c["HostConfig"]["ReadonlyRootfs"] is True, name
            assert not c["EffectiveCaps"], (name, c["EffectiveCaps"])  # capabilities: drop: [ALL]
            assert "no-new-privileges" in c["HostConfig"]["SecurityOpt"], name  # allowPrivilegeEscalation: false
            assert c["HostConfig"]["Memory"] == 512 * 2**20, name  # limits: memory 512Mi
            assert c["HostConfig"]["CpuQuota"] == c["HostConfig"]["CpuPeriod"], name  # limits: cpu 1
            # As the kernel sees it: the service process runs as 10001 on the host (no user namespace).
            assert pods.podman("top", name, "huser").stdout.split()[1:] == ["10001"], name
    # And from inside: uid and gid 10001, the root file system read-only, /tmp (emptyDir) writable.
    name = deployed.containers("enqueue")[0]
    r = pods.podman("exec", name, "python", "-c",
                    "import os, errno\n"
                    "print(os.getuid(), os.getgid())\n"
                    "open('/tmp/probe', 'w').write('x')\n"
                    "try:\n open('/etc/probe', 'w')\nexcept OSError as e:\n print(errno.errorcode[e.errno])\n")
    assert r.stdout.split() == ["10001", "10001", "EROFS"]


def test_the_go_client_scenarios_pass_through_the_pods(deployed: Deployed):
    if not os.path.exists(os.path.join(GO, "mailqueue", "v1", "enqueue_grpc.pb.go")):
        pytest.fail("the Go stubs are missing: run `make contract`")
    env = {**os.environ, "MAILQUEUE_TOKEN": deployed.token("admin"),
           "MAILQUEUE_ENQUEUE_TARGET": deployed.target("enqueue"),
           "MAILQUEUE_DEQUEUE_TARGET": deployed.target("dequeue"),
           "MAILQUEUE_BROWSE_TARGET": deployed.target("browse")}
    r = subprocess.run(["go", "test", "-count=1", "-v", "./..."], cwd=GO, env=env, capture_output=True, text=True, timeout=600)
    print(r.stdout[-3000:], r.stderr[-2000:])
    assert r.returncode == 0
    from tests.contract.test_languages import scenario_names

    for name in scenario_names():
        assert f"--- PASS: TestScenarios/{name.replace(' ', '_')} " in r.stdout, name


def test_without_a_token_the_pods_refuse_and_with_the_wrong_role_too(deployed: Deployed):
    stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(deployed.target("enqueue")))
    request = enqueue_pb2.EnqueueRequest(queue="deploy-auth", mail=mail_pb2.Mail(name="x", recipients=["a@example.org"]),
                                         inline_content=b"x")
    with pytest.raises(grpc.RpcError) as e:
        stub.Enqueue(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub.Enqueue(request, timeout=10, metadata=(("authorization", f"Bearer {deployed.token('consumer')}"),))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


def _new_queue(deployed: Deployed) -> str:
    queue = f"deploy-{uuid.uuid4().hex[:8]}"
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(deployed.target("browse")))
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue), timeout=30,
                      metadata=(("authorization", f"Bearer {deployed.token('admin')}"),))
    return queue


def _run_load(deployed: Deployed, fault, min_acked_after: int = 100, producers: int = 2) -> Load:
    """Load through the pods; ``fault()`` once 100 mails are acked; the load goes on until
    ``min_acked_after`` more are acked, then drains. The load, stopped."""
    load = Load(deployed.target("enqueue"), deployed.target("dequeue"), _new_queue(deployed),
                producers=producers, consumers=1, token=deployed.token("admin")).start()
    try:
        wait_until(lambda: len(load.acked) >= 100, 60, interval=0.1, what="100 mails acked before the fault")
        fault()
        base = len(load.acked)
        wait_until(lambda: len(load.acked) >= base + min_acked_after, 120, interval=0.2, what="mails acked after the fault")
        load.stop_producing()
        missing = load.wait_delivered(120)
        assert missing == [], f"{len(missing)} acked mails never delivered"
    finally:
        load.stop()
    # OK or UNAVAILABLE; and ABORTED "in progress" for a mail whose first attempt died with its pod:
    # its idempotency claim is the dead pod's until it expires, and the producer retries it.
    bad = [c for c in load.bad_calls() if not (c.code == "ABORTED" and "is in progress" in c.detail)]
    assert bad == [], load.error_details()
    in_flight = {c.detail for c in load.bad_calls()}
    assert len(in_flight) <= load.producers, in_flight  # at most the mail each producer had in flight
    assert load.delivered_after_confirmed_success() == []
    return load


def test_a_killed_enqueue_pod_leaves_its_peer_serving_and_no_acked_mail_lost(deployed: Deployed):
    victim = deployed.rendered.pods["enqueue"][1]
    killed_at: list[float] = []

    def kill() -> None:
        pods.podman("pod", "kill", victim)
        killed_at.append(time.monotonic())

    # Four producers: a producer whose mail was in flight in the victim waits for its claim (30 s);
    # the others go on through the peer.
    load = _run_load(deployed, kill, producers=4)
    assert load.lost() == []
    # The peer answered while the victim was gone: no 5 s without an OK enqueue after the kill.
    assert load.longest_gap("enqueue", killed_at[0], killed_at[0] + 5) < 5
    # What the ReplicaSet controller does: a pod in its place, SERVING again.
    pods.podman("pod", "start", victim)
    target = deployed.rendered.targets["enqueue"][1]
    wait_until(lambda: health(target) == SERVING, 60, interval=0.2, what="the replaced enqueue pod SERVING")


def test_a_service_killed_inside_its_pod_is_restarted_and_no_acked_mail_lost(deployed: Deployed):
    name = deployed.containers("dequeue")[0]
    before = pods.inspect(name)
    target = deployed.rendered.targets["dequeue"][0]

    def kill() -> None:  # kill -9 of the service process, as the OOM killer or a crash would
        os.kill(before["State"]["Pid"], signal.SIGKILL)

    load = _run_load(deployed, kill)
    assert load.lost() == []
    after = pods.inspect(name)
    assert after["RestartCount"] == before["RestartCount"] + 1  # restartPolicy: Always, as the kubelet's
    assert after["State"]["Pid"] != before["State"]["Pid"]
    assert health(target) == SERVING


def _pid(component: str) -> int:
    with open(os.path.join(ROOT, ".stack", f"{component}.pid")) as f:
        return int(f.read())


def test_backends_gone_fail_readiness_not_liveness_and_the_pods_come_back_without_a_restart(deployed: Deployed):
    containers = [n for c in SERVICE_NAMES for n in deployed.containers(c)]
    before = {n: (pods.inspect(n)["RestartCount"], pods.inspect(n)["State"]["Pid"]) for n in containers}
    queue_services = [t for c in ("enqueue", "dequeue", "browse") for t in deployed.rendered.targets[c]]
    every = [t for ts in deployed.rendered.targets.values() for t in ts]
    cassandra = _pid("cassandra")
    stack("rabbitmqctl", "stop_app")  # RabbitMQ gone (its port closed), Cassandra frozen (answers nothing)
    os.kill(cassandra, signal.SIGSTOP)
    try:
        wait_until(lambda: all(health(t) == NOT_SERVING for t in queue_services), 60, interval=0.5,
                   what="readiness NOT_SERVING on enqueue, dequeue and browse")
        for t in every:  # liveness still answers: the kubelet would not restart these pods
            assert health(t, "liveness") == SERVING, t
        stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(deployed.target("enqueue")))
        with pytest.raises(grpc.RpcError) as e:
            stub.Enqueue(enqueue_pb2.EnqueueRequest(queue="deploy-outage", mail=mail_pb2.Mail(name="x", recipients=["a@example.org"]),
                                                    inline_content=b"x"),
                         timeout=30, metadata=(("authorization", f"Bearer {deployed.token('admin')}"),))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        os.kill(cassandra, signal.SIGCONT)
        stack("rabbitmqctl", "start_app")
    wait_until(deployed.all_serving, 120, interval=0.5, what="every pod SERVING again")
    after = {n: (pods.inspect(n)["RestartCount"], pods.inspect(n)["State"]["Pid"]) for n in containers}
    assert after == before  # the same processes: back without a restart


def test_the_sweep_runs_once_as_its_cronjob_would_and_exits_0(deployed: Deployed):
    start = time.monotonic()
    name = pods.play_sweep(deployed.rendered)
    try:
        wait_until(lambda: pods.inspect(name)["State"]["Status"] == "exited", 600, interval=1, what="the sweep to finish")
        c = pods.inspect(name)
        logs = pods.podman("logs", name).stdout + pods.podman("logs", name).stderr
        assert c["State"]["ExitCode"] == 0, logs[-3000:]
        assert c["Config"]["User"] == "10001:10001" and c["HostConfig"]["ReadonlyRootfs"] is True
        assert '"msg": "sweep finished"' in logs, logs[-3000:]
        deployed.report["sweep_s"] = round(time.monotonic() - start, 1)
    finally:
        pods.podman("pod", "rm", "--force", deployed.rendered.sweep["metadata"]["name"], check=False)
