"""#37: the manifests on a real Kubernetes (stack/kube/kube.sh), driven from pods as users do.

In the order an operator meets them: the Deployments become Available under the kubelet's probes;
the scheduled sweep; clients in pods reach every Service by name, spread over the replicas; the
autoscaler scales enqueue out under load and back in; a rolling update of enqueue, dequeue and
browse under load; readiness with the broker stopped; the PodDisruptionBudgets against evictions;
the NetworkPolicies; SIGKILL inside a pod, and a pod of two workers. Each test prints its figures (docs/pages/deploying/local-kubernetes.md quotes them).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from stack.harness import ROOT, broker_stopped, drop_queues, wait_until
from tests.kubernetes import kube

ALLOWED_CODES = {"OK", "UNAVAILABLE"}


#: Queues made for this module's tests and not handed out yet.
_MADE: list[str] = []
#: Every queue made, whose RabbitMQ queues go when the module ends (the local stack's broker
#: outlives the tier: 18 idle quorum queues a run were left on it).
_ALL_MADE: list[str] = []

#: How many queues the module's tests take (one pod makes them all: a pod start is 5-6 s here).
QUEUES_MADE = 6
_CREATE_EACH = ("import os, subprocess, sys\n"
                "for name in sys.argv[1:]:\n"
                "    subprocess.run(['mailq', '--browse', os.environ['MAILQUEUE_BROWSE_TARGET'], '--token',"
                " os.environ['MAILQUEUE_TOKEN'], 'create', name], check=True)")


@pytest.fixture(scope="module", autouse=True)
def _made_queues_dropped() -> Iterator[None]:
    yield
    drop_queues(_ALL_MADE)  # the client pods are gone: no consumer holds them
    _ALL_MADE.clear()


def new_queue() -> str:
    """A queue made through the admin service from a labelled pod, as an operator would (mailq)."""
    if not _MADE:
        names = [f"k-{uuid.uuid4().hex[:8]}" for _ in range(QUEUES_MADE)]
        phase, log = kube.run_pod(kube.client_pod(
            f"mailq-{names[0]}", ["python", "-c", _CREATE_EACH, *names],
            labels={"mailqueue-admin": "true"}, reach=("browse",)), timeout=120)
        assert phase == "Succeeded", log
        assert all(f"{n}: created" in log for n in names), log
        _MADE.extend(names)
        _ALL_MADE.extend(names)
    return _MADE.pop(0)


def codes_only_ok_or_unavailable(record: dict) -> None:
    bad = {k: v for k, v in record["codes"].items() if k.split()[1] not in ALLOWED_CODES}
    assert not bad, (bad, record["details"])


def load_pod(name: str, queue: str, producers: int, consumers: int, rate: float = 0.0, seconds: float = 900) -> str:
    return kube.start_pod(kube.client_pod(
        name, ["python", "/client/client.py", "--queue", queue, "--producers", str(producers),
               "--consumers", str(consumers), "--rate", str(rate), "--seconds", str(seconds)],
        labels={"mailqueue-client": "true"}, reach=("enqueue", "dequeue")))


# ---------------------------------------------------------------------------------- a. probes
def test_every_deployment_becomes_available_under_the_kubelets_probes(applied):
    for c in kube.DEPLOYMENTS:
        pods = kube.pods(c, ready_only=True)
        assert pods, c
        for p in pods:
            [container] = p["spec"]["containers"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert "grpc" in container[probe], (c, probe)
            [status] = p["status"]["containerStatuses"]
            assert status["started"] and status["ready"], (c, status)
            assert status["restartCount"] == 0, kube.restart_evidence(p)
            # The kubelet's gRPC probes reach the health service: the pod counts them.
            checks = kube.metric(p["status"]["podIP"], c, "mailqueue_rpc_total", method="Check")
            assert checks > 0, (c, p["metadata"]["name"])
    print(f"Available after kubectl apply -k (s): {applied.available_s}; apply itself {applied.apply_s} s")


# ---------------------------------------------------------------------------------- TLS rotation
def _served_certificate(pod_ip: str, port: int) -> bytes:
    """The certificate a new TLS connection to the pod gets, its chain checked against the local CA."""
    import socket
    import ssl

    context = ssl.create_default_context(cafile=f"{ROOT}/.stack/pki/ca.crt")
    context.check_hostname = False  # a pod IP is not among the names; the chain is what is checked
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((pod_ip, port), timeout=5) as sock, context.wrap_socket(sock) as tls:
        return tls.getpeercert(binary_form=True)


@pytest.mark.timeout(420)
def test_a_renewed_certificate_secret_is_served_without_restarts_while_clients_stream(applied):
    """Rotation as cert-manager does it: the Secret mailqueue-tls gets a new certificate; the
    kubelet swaps the mounted files; every pod serves it to new connections without a restart,
    and a client streaming through the rotation loses nothing."""
    import ssl

    queue = new_queue()
    client = load_pod("rotation", queue, producers=2, consumers=2, rate=0.02)
    pods = {c: kube.pods(c, ready_only=True) for c in kube.COMPONENTS}
    restarts = {p["metadata"]["name"]: kube.restarts(p["metadata"]["name"]) for ps in pods.values() for p in ps}
    before = {p["metadata"]["name"]: _served_certificate(p["status"]["podIP"], kube.PORTS[c]) for c, ps in pods.items() for p in ps}
    subprocess.run([f"{ROOT}/stack/pki.sh", "renew", "services"], check=True, capture_output=True)
    subprocess.run([kube.KUBE, "secrets", kube.NAMESPACE], check=True, capture_output=True)
    renewed = ssl.PEM_cert_to_DER_cert(open(f"{ROOT}/.stack/pki/services.crt").read())
    assert all(b != renewed for b in before.values())
    started = time.monotonic()
    for c, ps in pods.items():
        for p in ps:
            wait_until(lambda: _served_certificate(p["status"]["podIP"], kube.PORTS[c]) == renewed, 240, interval=2,
                       what=f"{p['metadata']['name']} to serve the renewed certificate")
    took = time.monotonic() - started
    record = kube.finish_client(client)
    assert record["lost"] == [] and record["acked"] > 0
    codes_only_ok_or_unavailable(record)
    assert {name: kube.restarts(name) for name in restarts} == restarts  # no restart
    print(f"renewed certificate served by all {len(restarts)} pods {took:.0f} s after the Secret changed, no restart; "
          f"{record['acked']} mails through the rotation, lost 0; codes {record['codes']}")


# ---------------------------------------------------------------------------------- b. clients by name
@pytest.mark.timeout(600)  # 190 s on this machine: the Go build, four scenarios in a pod, then the load
def test_clients_in_pods_reach_every_service_by_name_spread_over_the_replicas(applied):
    # The Go contract client's scenarios, built static and run in a pod of the image.
    binary = f"{ROOT}/.stack/kube-tier/contract.test"
    subprocess.run(["go", "test", "-c", "-o", binary, "."], cwd=f"{ROOT}/tests/contract/go", check=True,
                   env={**__import__("os").environ, "CGO_ENABLED": "0"}, capture_output=True)
    contract = {"name": "contract", "hostPath": {"path": f"{ROOT}/tests/contract", "type": "Directory"}}
    bin_dir = {"name": "bin", "hostPath": {"path": f"{ROOT}/.stack/kube-tier", "type": "Directory"}}
    phase, log = kube.run_pod(kube.client_pod(
        "go-contract", ["/bin-go/contract.test", "-test.v", "-test.count=1"],
        labels={"mailqueue-client": "true", "mailqueue-admin": "true"},
        volumes=[contract, bin_dir], mounts=[{"name": "contract", "mountPath": "/contract", "readOnly": True},
                                             {"name": "bin", "mountPath": "/bin-go", "readOnly": True}],
        workdir="/contract/go", reach=("browse", "enqueue", "dequeue")), timeout=300)
    assert phase == "Succeeded", log[-3000:]
    passed = [line for line in log.splitlines() if line.strip().startswith("--- PASS: TestScenarios/")]
    assert passed and "FAIL" not in log, log[-3000:]

    # mailq from the image, by the browse Service's name.
    queue = new_queue()
    phase, log = kube.run_pod(kube.client_pod(
        "mailq-show", ["mailq", "--browse", "$(MAILQUEUE_BROWSE_TARGET)", "--token", "$(MAILQUEUE_TOKEN)", "show", queue],
        labels={"mailqueue-admin": "true"}, reach=("browse",)), timeout=120)
    assert phase == "Succeeded" and queue in log, log

    # Load from a pod: every enqueue and dequeue replica serves a share of it. The replicas are
    # those Ready when the load starts: one the autoscaler adds meanwhile is reached only when the
    # client resolves the name again (a GOAWAY at the servers' max connection age, 120 s in dev).
    before = {c: {p["metadata"]["name"]: _served(p, c) for p in kube.pods(c, ready_only=True)} for c in ("enqueue", "dequeue")}
    client = load_pod("spread", queue, producers=4, consumers=2, rate=0.01)

    def served_by_each() -> dict[str, dict[str, float]]:
        now = {c: {p["metadata"]["name"]: _served(p, c) for p in kube.pods(c, ready_only=True)} for c in before}
        return {c: {name: now[c][name] - count for name, count in before[c].items() if name in now[c]} for c in before}

    try:
        wait_until(lambda: all(n >= 20 for per_pod in served_by_each().values() for n in per_pod.values()), 120, interval=1,
                   what="every enqueue and dequeue replica to serve")
    finally:
        record = kube.finish_client(client)
    served = served_by_each()
    assert record["lost"] == [] and record["acked"] > 0
    codes_only_ok_or_unavailable(record)
    print(f"Go scenarios passed in a pod: {len(passed)}; mailq show by Service name: ok; "
          f"{record['acked']} mails, RPCs served per replica: {json.dumps(served)}")


def _served(pod: dict, component: str) -> float:
    method = "Enqueue" if component == "enqueue" else "Dequeue"
    return kube.metric(pod["status"]["podIP"], component, "mailqueue_rpc_total", method=method)


# ---------------------------------------------------------------------------------- g. sweep
# After the clients' test: by then the every-minute CronJob has usually run once (the sweep's
# Spark job then runs beside tests that do not measure load; it is suspended before those that do).
@pytest.mark.timeout(420)
def test_the_sweep_cronjob_fires_on_schedule_as_its_own_account_and_never_overlaps(applied):
    started = time.monotonic()
    seen_active: list[int] = []

    def completed_job() -> dict | None:
        seen_active.append(len(kube.get("cronjob", "mailqueue-sweep").get("status", {}).get("active") or []))
        jobs = [j for j in kube.get("jobs")["items"]
                if any(o["kind"] == "CronJob" and o["name"] == "mailqueue-sweep" for o in j["metadata"].get("ownerReferences", []))]
        return next((j for j in jobs if j.get("status", {}).get("succeeded")), None)

    job = wait_until(completed_job, 360, interval=2, what="a scheduled sweep to complete")
    took = time.monotonic() - started
    kube.ns("patch", "cronjob", "mailqueue-sweep", "-p", '{"spec": {"suspend": true}}')  # the later tests measure load
    # A Job retries a failed pod (backoffLimit 2): the one that succeeded is the sweep's run.
    pods = kube.get("pods", selector=f"job-name={job['metadata']['name']}")["items"]
    failed = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Failed"]
    [pod] = [p for p in pods if p["status"].get("phase") == "Succeeded"]
    assert all(p["spec"]["serviceAccountName"] == "mailqueue-sweep" for p in pods)
    assert max(seen_active) <= 1  # concurrencyPolicy Forbid: never two at once
    log = kube.ns("logs", pod["metadata"]["name"]).stdout
    for name in failed:  # why an attempt failed, for whoever reads the run
        print(f"failed attempt {name}: {kube.ns('logs', name).stdout.strip()[-600:]}")
    duration = (_time(job["status"]["completionTime"]) - _time(job["status"]["startTime"]))
    print(f"scheduled sweep {job['metadata']['name']}: completed {took:.0f} s into the test, ran {duration:.0f} s; "
          f"active jobs seen at once: {max(seen_active)}; failed attempts before it: {failed}; last log line: {log.strip().splitlines()[-1][:200]}")


def _time(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------------------------- c. autoscaling
@pytest.mark.timeout(900)
def test_the_autoscaler_scales_enqueue_out_under_load_and_back_in(applied):
    queues = [new_queue(), new_queue()]  # one per client pod: each checks its own mails
    floor = kube.get("hpa", "mailqueue-enqueue")["spec"]["minReplicas"]
    timeline: list[tuple[float, int, str]] = []
    start = time.monotonic()

    def sample() -> int:
        hpa = kube.get("hpa", "mailqueue-enqueue")
        replicas = hpa.get("status", {}).get("currentReplicas", 0)
        cpu = next((m["resource"]["current"].get("averageUtilization") for m in hpa.get("status", {}).get("currentMetrics") or []
                    if m.get("type") == "Resource"), None)
        timeline.append((round(time.monotonic() - start), replicas, f"{cpu}%"))
        return replicas

    def with_timeline(e: AssertionError) -> AssertionError:
        return AssertionError(f"{e}; (s, replicas, cpu of request): {timeline}; pods: {kube.pod_phases()}")

    # The base's target (70 % of the request); the local overlay requests 100m a pod, so the
    # scheduler always has room for the extra replicas (at 250m a third enqueue pod stayed Pending,
    # and a Pending pod counts as 100 % when the autoscaler considers scaling in).
    clients = [load_pod(f"producers-{i}", queue, producers=16, consumers=2) for i, queue in enumerate(queues)]
    try:
        try:
            wait_until(lambda: sample() > floor, 420, interval=2, what="the autoscaler to add enqueue replicas")
        except AssertionError as e:
            raise with_timeline(e) from None
        peak = max(r for _, r, _ in timeline)
        wait_until(lambda: kube.available("enqueue") and len(kube.pods("enqueue", ready_only=True)) > floor, 180,
                   interval=2, what="the new replica Ready")
    finally:
        records = kube.finish_clients(clients)
    try:
        wait_until(lambda: sample() == floor, 420, interval=2, what="the autoscaler to scale enqueue back in")
    except AssertionError as e:
        raise with_timeline(e) from None
    for record in records:
        assert record["lost"] == [], record["lost"][:10]
        codes_only_ok_or_unavailable(record)
    print(f"enqueue replicas over time (s, replicas, cpu of request): {timeline}; peak {peak}; "
          f"acked {sum(r['acked'] for r in records)}, lost 0, codes {[r['codes'] for r in records]}, "
          f"first details {[r['details'] for r in records]}")


# ---------------------------------------------------------------------------------- d. rolling update
@pytest.mark.timeout(900)
def test_a_rolling_update_under_load_loses_nothing_and_keeps_serving(applied):
    queue = new_queue()
    client = load_pod("rollout", queue, producers=3, consumers=2, rate=0.02)
    wait_until(lambda: kube.acked_so_far(client) > 50, 120, interval=1, what="the load to run")
    drains: list[dict] = []
    steps: list[tuple[str, float, float]] = []
    # The three at once, as an upgrade to a new image rolls them.
    components = ("enqueue", "dequeue", "browse")
    watchers = [_follow(p["metadata"]["name"], drains) for c in components for p in kube.pods(c)]
    began = time.time()
    for c in components:
        kube.ns("rollout", "restart", f"deployment/{kube.deployment(c)}")
    for c in components:
        try:
            kube.ns("rollout", "status", f"deployment/{kube.deployment(c)}", "--timeout=300s", timeout=320)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\npods: {kube.pod_phases()}") from None
        steps.append((c, round(began, 1), round(time.time() - began, 1)))
    for w in watchers:
        w.join(90)
    record = kube.finish_client(client)
    assert record["lost"] == [], (record, kube.view_states(queue, record["lost"]))
    assert record["delivered_after_confirmed_success"] == []
    codes_only_ok_or_unavailable(record)
    grace = kube.get("deployment", "mailqueue-enqueue")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    for d in drains:
        assert d["not_serving_first"] and d["stopped"] and d["seconds"] < grace, d
    print(f"rolling restart of enqueue, dequeue, browse under load: acked {record['acked']}, lost 0, "
          f"deliveries after a confirmed SUCCESS 0, codes {record['codes']}; longest gap without an OK enqueue "
          f"{record['longest_enqueue_gap_s']} s, without a delivery {record['longest_delivery_gap_s']} s; "
          f"terminating pods (s from SIGTERM to exit): {[(d['pod'], d['seconds']) for d in drains]}; rollouts (began, s): "
          f"{steps}; gaps began at {record['longest_enqueue_gap_at']:.1f}, {record['longest_delivery_gap_at']:.1f}; "
          f"slowest Enqueue {record['slowest_enqueue_s']} s")
    # Keeps serving: no 3 s without an OK Enqueue. A client that lost the replica it was connected
    # to waits for its DNS re-resolution (at most 1 s apart) and gRPC's reconnect backoff (1 s,
    # jittered): 2.18 s was measured once on CI with every tier's servers running, 2.19-2.33 s here.
    # Deliveries: no 10 s without one. At load 10-13 on the 2-core node they paused 6.7 s as the
    # browse rollout ended (a sweep CronJob running; 4.5 s when the three Deployments rolled at
    # once), though deliveries do not go through browse_svc; the cause is not found yet (the
    # printed gap start and the rollouts' times are where to look).
    assert record["longest_enqueue_gap_s"] < 3.0 and record["longest_delivery_gap_s"] < 10.0


def _follow(pod: str, out: list[dict]) -> threading.Thread:
    """Follow a pod's log until it exits: did it say draining (NOT_SERVING first) and stopped, and how long after."""
    def run() -> None:
        p = subprocess.Popen([kube.kubectl_path(), "--kubeconfig", kube.KUBECONFIG, "-n", kube.NAMESPACE, "logs", "-f", pod],
                             stdout=subprocess.PIPE, text=True)
        draining_at = None
        entry = {"pod": pod, "not_serving_first": False, "stopped": False, "seconds": None}
        for line in p.stdout:
            if '"draining"' in line:
                draining_at = time.monotonic()
                entry["not_serving_first"] = True  # serve() sets NOT_SERVING right after this line
            if '"stopped"' in line and draining_at is not None:
                entry["stopped"], entry["seconds"] = True, round(time.monotonic() - draining_at, 2)
        p.wait()
        out.append(entry)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------- e. readiness
@pytest.mark.timeout(600)
def test_with_the_broker_stopped_pods_leave_the_endpoints_and_come_back_by_themselves(applied):
    components = ("enqueue", "dequeue")
    before = {c: kube.endpoints(c) for c in components}
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
                for c in components for p in kube.pods(c, ready_only=True)}
    assert all(before.values())
    with broker_stopped():
        start = time.monotonic()
        wait_until(lambda: not any(kube.endpoints(c) for c in components), 120, interval=1,
                   what="enqueue and dequeue to leave their Services' endpoints")
        left = time.monotonic() - start
    start = time.monotonic()

    def every_live_pod_back() -> bool:
        # The autoscaler may scale in (or out) meanwhile: the earlier tests load both Deployments
        # and its scale-in waits 5 minutes. So "back" is every pod that still runs, not the set of
        # before (a pod it removed never returns).
        for c in components:
            live = {p["status"].get("podIP") for p in kube.pods(c)}
            if not live or kube.endpoints(c) != live:
                return False
        return True

    try:
        wait_until(every_live_pod_back, 180, interval=1, what="every running pod back in the endpoints")
    except AssertionError as e:
        raise AssertionError(f"{e}; endpoints before {before}, now {({c: kube.endpoints(c) for c in components})}; "
                             f"pods {kube.pod_phases()}") from None
    back = time.monotonic() - start
    after = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
             for c in components for p in kube.pods(c)}
    kept = {name: n for name, n in restarts.items() if name in after}
    assert kept and {name: after[name] for name in kept} == kept  # not restarted: readiness, not liveness
    print(f"broker stopped: out of the endpoints after {left:.1f} s; broker started: back after {back:.1f} s; "
          f"restarts 0 of {len(kept)} pods ({len(restarts) - len(kept)} removed by the autoscaler meanwhile)")


# ---------------------------------------------------------------------------------- f. disruption budget
def test_evictions_leave_the_floor_of_replicas_serving(applied):
    floor = kube.get("pdb", "mailqueue-enqueue")["spec"]["minAvailable"]
    pods = [p["metadata"]["name"] for p in kube.pods("enqueue", ready_only=True)]
    assert len(pods) > floor
    answers = []
    for pod in pods:
        r = kube.kubectl("create", "--raw", f"/api/v1/namespaces/{kube.NAMESPACE}/pods/{pod}/eviction", "-f", "-",
                         check=False, stdin=json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                                                        "metadata": {"name": pod, "namespace": kube.NAMESPACE}}))
        answers.append((pod, r.returncode, (r.stderr or r.stdout).strip()[:160]))
        assert len(kube.endpoints("enqueue")) >= floor
    evicted = [a for a in answers if a[1] == 0]
    refused = [a for a in answers if a[1] != 0]
    assert len(evicted) == len(pods) - floor and refused and all("disruption budget" in a[2] for a in refused), answers
    wait_until(lambda: len(kube.pods("enqueue", ready_only=True)) >= len(pods), 180, interval=1,
               what="the evicted replica replaced")
    print(f"evictions of {len(pods)} enqueue pods (PDB minAvailable {floor}): {answers}")


# ---------------------------------------------------------------------------------- h. network policy
def test_network_policies_keep_admin_and_blob_to_those_they_name(applied):
    # Asked for 15 s: a new pod's address takes a moment to reach the policy controller's ipsets.
    probe = ("import grpc,os,sys,time; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g\n"
             "c=grpc.ssl_channel_credentials(open(os.environ['MAILQUEUE_TLS_CA'],'rb').read())\n"
             "s=g.HealthStub(grpc.secure_channel(sys.argv[1], c)); end=time.time()+15\n"
             "while time.time()<end:\n"
             "  try: print('ANSWERED', s.Check(h.HealthCheckRequest(), timeout=2).status); break\n"
             "  except grpc.RpcError as e: err=e; time.sleep(0.3)\n"
             "else: print('REFUSED', err.code().name, err.details())")

    browse = f"{kube.deployment('browse')}.{kube.NAMESPACE}.svc.cluster.local:{kube.PORTS['browse']}"
    blob = f"{kube.deployment('blob')}.{kube.NAMESPACE}.svc.cluster.local:{kube.PORTS['blob']}"
    probes = {  # the four probe pods run side by side, each with its own 15 s
        "admin from an unlabelled pod": ("np-admin-no", browse, {}),
        "admin from a mailqueue-admin pod": ("np-admin-yes", browse, {"mailqueue-admin": "true"}),
        "blob from an unlabelled pod": ("np-blob-no", blob, {}),
        "blob from a suite service's pod": ("np-blob-yes", blob, {"app.kubernetes.io/component": "browse"}),
    }
    ran = kube.run_pods([kube.client_pod(name, ["python", "-c", probe, target], labels=labels)
                         for name, target, labels in probes.values()], timeout=120)
    # Each probe ran and said what it met (a pod that crashed says neither: not a refusal).
    assert all(phase == "Succeeded" and ("ANSWERED" in log or "REFUSED" in log) for phase, log in ran), ran
    results = {what: "ANSWERED" in log for what, (_, log) in zip(probes, ran, strict=True)}
    print(f"NetworkPolicy (kube-router): {results}")
    assert results == {"admin from an unlabelled pod": False, "admin from a mailqueue-admin pod": True,
                       "blob from an unlabelled pod": False, "blob from a suite service's pod": True}


# ---------------------------------------------------------------------------------- crash-only
@pytest.mark.timeout(600)
def test_a_service_killed_with_sigkill_inside_its_pod_is_restarted_and_loses_no_acked_mail(applied):
    import os
    import signal

    queue = new_queue()
    client = load_pod("sigkill", queue, producers=3, consumers=2, rate=0.02)
    wait_until(lambda: kube.acked_so_far(client) > 50, 120, interval=1, what="the load to run")
    killed = {}
    for c in ("enqueue", "dequeue"):
        pod = kube.pods(c, ready_only=True)[0]
        name = pod["metadata"]["name"]
        killed[name] = kube.restarts(name)
        os.kill(kube.host_pid(pod), signal.SIGKILL)  # no shutdown code runs
    start = time.monotonic()
    wait_until(lambda: all(kube.restarts(n) == r + 1 and kube.is_ready(kube.get("pod", n)) for n, r in killed.items()),
               180, interval=1, what="the killed services restarted by the kubelet and Ready")
    back = time.monotonic() - start
    record = kube.finish_client(client)
    assert record["lost"] == [], (record, kube.view_states(queue, record["lost"]))
    assert record["delivered_after_confirmed_success"] == []
    # ABORTED too: a key whose enqueue the killed process held is "in progress" until the killed
    # process's lease expires (MAILQUEUE_CLAIM_LEASE_S); the client retries it, as told.
    bad = {k: v for k, v in record["codes"].items() if k.split()[1] not in ALLOWED_CODES | {"ABORTED"}}
    assert not bad, (bad, record["details"])
    print(f"SIGKILL of {list(killed)} under load: restarted and Ready after {back:.1f} s; acked {record['acked']}, "
          f"lost 0; codes {record['codes']}")


@pytest.mark.timeout(420)
def test_a_pod_of_two_workers_passes_its_probes_and_starts_a_killed_worker_again(applied):
    """MAILQUEUE_WORKERS=2 in a pod of enqueue's own template (a Deployment of one replica beside
    enqueue's, deleted after): the kubelet's probes pass, the pod's one metrics port serves both
    workers, and a worker killed with SIGKILL is started again inside the pod (no container restart)."""
    import copy
    import os
    import signal

    base = kube.get("deployment", kube.deployment("enqueue"))
    name, variant = "mailqueue-enqueue-workers", {"mailqueue.test/variant": "workers"}
    template = copy.deepcopy(base["spec"]["template"])
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **variant}
    container = template["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "MAILQUEUE_WORKERS"] + [{"name": "MAILQUEUE_WORKERS", "value": "2"}]
    kube.apply([{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": base["metadata"]["labels"]},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {**base["spec"]["selector"]["matchLabels"], **variant}},
                          "template": template}}])

    def pod() -> dict | None:
        items = [p for p in kube.get("pods", selector="mailqueue.test/variant=workers")["items"]
                 if not p["metadata"].get("deletionTimestamp")]
        return items[0] if items and kube.is_ready(items[0]) else None

    def workers(pid: int) -> list[int]:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]

    try:
        started = time.monotonic()
        ready = wait_until(pod, 240, interval=1, what="the pod of two workers Ready under the kubelet's probes")
        took = time.monotonic() - started
        supervisor, ip = kube.host_pid(ready), ready["status"]["podIP"]
        first = workers(supervisor)
        assert len(first) == 2, first
        # Ready once a probe reached one SERVING worker; the other may still be connecting.
        wait_until(lambda: kube.metric(ip, "enqueue", "mailqueue_serving") == 2, 60, interval=1,
                   what="both workers SERVING, a series each on the pod's one metrics port")
        probes = wait_until(lambda: kube.metric(ip, "enqueue", "mailqueue_rpc_total", method="Check"), 60, interval=1,
                            what="the probes counted")
        os.kill(first[0], signal.SIGKILL)
        wait_until(lambda: len(workers(supervisor)) == 2 and first[0] not in workers(supervisor), 60, interval=0.5,
                   what="the killed worker started again")
        wait_until(lambda: kube.metric(ip, "enqueue", "mailqueue_serving") == 2, 60, interval=1, what="both SERVING again")
        assert kube.restarts(ready["metadata"]["name"]) == 0
        assert kube.is_ready(kube.get("pod", ready["metadata"]["name"]))
        print(f"a pod of 2 workers: Ready after {took:.1f} s, {probes:.0f} probe calls counted on its one metrics port; "
              f"a worker killed with SIGKILL started again, no container restart")
    finally:
        kube.ns("delete", "deployment", name, "--wait=false", check=False)


# ---------------------------------------------------------------------------------- access
def test_pods_run_as_uid_10001_and_refuse_calls_without_the_right_token(applied):
    for c in kube.COMPONENTS:
        pod = kube.pods(c, ready_only=True)[0]["metadata"]["name"]
        assert kube.ns("exec", pod, "--", "id", "-u").stdout.strip() == "10001", c
    check = ("import grpc,os,sys; from mailqueue.v1 import enqueue_pb2 as e, enqueue_pb2_grpc as g\n"
             "c=grpc.ssl_channel_credentials(open(os.environ['MAILQUEUE_TLS_CA'],'rb').read())\n"
             "s=g.EnqueueServiceStub(grpc.secure_channel(os.environ['MAILQUEUE_ENQUEUE_TARGET'], c))\n"
             "for who, md in (('none', None), ('consumer', (('authorization', 'Bearer '+os.environ['CONSUMER_TOKEN']),))):\n"
             "  try: s.Enqueue(e.EnqueueRequest(queue='q'), metadata=md, timeout=10); print(who, 'OK')\n"
             "  except grpc.RpcError as x: print(who, x.code().name)")
    phase, log = kube.run_pod(kube.client_pod("tokens", ["python", "-c", check], labels={"mailqueue-client": "true"},
                                              reach=("enqueue",)), timeout=120)
    assert "none UNAUTHENTICATED" in log and "consumer PERMISSION_DENIED" in log, log
    print("uid 10001 in every service pod; without a token: UNAUTHENTICATED, consumer token on Enqueue: PERMISSION_DENIED")
