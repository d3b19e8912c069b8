"""The single-node cluster of stack/kube/kube.sh as the Kubernetes tier drives it: kubectl with the
admin kubeconfig, the overlay applied with ``kubectl apply -k``, client pods, the pods' metrics.

The test process reaches pods only on their own addresses (10.244.0.0/24, on this machine), as a
Prometheus on the node would; every client call goes from a pod to a Service name.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess

import yaml

from stack.harness import ROOT, scrape, wait_until

KUBECONFIG = os.path.join(os.environ.get("MAILQUEUE_STACK_DIR", os.path.join(ROOT, ".stack")), "kube", "admin.kubeconfig")
KUBE = os.path.join(ROOT, "stack", "kube", "kube.sh")
OVERLAY = os.path.join(ROOT, "k8s", "overlays", "local")
NAMESPACE = "mailqueue-dev"
COMPONENTS = ("enqueue", "dequeue", "browse", "blob")
#: Every Deployment of the overlay: the four above and webhook_svc (no Service clients call).
DEPLOYMENTS = (*COMPONENTS, "webhook")
PORTS = {"enqueue": 50051, "dequeue": 50052, "browse": 50053, "blob": 50054, "webhook": 50055}


@functools.cache
def kubectl_path() -> str:
    """The kubectl the cluster's scripts use (stack/kube/build.sh builds it; MAILQUEUE_KUBECTL
    names another), as `kube.sh env` says: no kubectl on the PATH is needed. Asked when first
    used, not at import (the other tiers collect this module too)."""
    out = subprocess.run(["bash", KUBE, "env"], capture_output=True, text=True, timeout=30, check=True).stdout
    return shlex.split(out.split("MAILQUEUE_KUBECTL=", 1)[1])[0]


def kubectl(*args: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([kubectl_path(), "--kubeconfig", KUBECONFIG, *args], capture_output=True, text=True,
                       timeout=timeout, input=stdin)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def ns(*args: str, **kw) -> subprocess.CompletedProcess:
    return kubectl("-n", NAMESPACE, *args, **kw)


def get(kind: str, name: str = "", selector: str = "") -> dict:
    args = ["get", kind, *([name] if name else []), *(["-l", selector] if selector else []), "-o", "json"]
    return json.loads(ns(*args).stdout)


def apply(docs: list[dict]) -> None:
    ns("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


def deployment(component: str) -> str:
    return f"mailqueue-{component}"


def selector(component: str) -> str:
    return f"app.kubernetes.io/name=mailqueue,app.kubernetes.io/component={component}"


def pods(component: str, ready_only: bool = False) -> list[dict]:
    items = [p for p in get("pods", selector=selector(component))["items"] if not p["metadata"].get("deletionTimestamp")]
    if ready_only:
        items = [p for p in items if is_ready(p)]
    return items


def pod_phases() -> list[tuple[str, str, str]]:
    """Every pod of the namespace: name, phase, and why it is not scheduled (e.g. Insufficient cpu)."""
    out = []
    for p in get("pods")["items"]:
        why = next((c.get("message", "") for c in p.get("status", {}).get("conditions", [])
                    if c["type"] == "PodScheduled" and c["status"] != "True"), "")
        out.append((p["metadata"]["name"], p.get("status", {}).get("phase", "?"), why))
    return out


def node_state() -> str:
    """The node's conditions that are not as they should be (DiskPressure, MemoryPressure,
    PIDPressure True; Ready not True) and its taints, on one line: why pods stay Pending."""
    bad, taints = [], []
    for node in get("nodes")["items"]:
        for c in node.get("status", {}).get("conditions", []):
            if (c["type"] == "Ready") != (c["status"] == "True"):
                bad.append(f"{c['type']}={c['status']} ({c.get('message', '')[:120]})")
        taints += [t["key"] for t in node.get("spec", {}).get("taints", [])]
    return f"node conditions: {'; '.join(bad) or 'all healthy'}; taints: {', '.join(taints) or 'none'}"


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def available(component: str) -> bool:
    status = get("deployment", deployment(component)).get("status", {})
    return any(c["type"] == "Available" and c["status"] == "True" for c in status.get("conditions", []))


def endpoints(component: str) -> set[str]:
    """The ready addresses of the component's Service (its EndpointSlices)."""
    slices = get("endpointslices", selector=f"kubernetes.io/service-name={deployment(component)}")["items"]
    return {a for s in slices for e in s.get("endpoints") or [] if e.get("conditions", {}).get("ready")
            for a in e["addresses"]}


def metric(pod_ip: str, component: str, name: str, **labels: str) -> float:
    """A Prometheus sample's sum served by one pod (its metrics port is the gRPC port + 1000)."""
    return scrape(PORTS[component] + 1000, name, host=pod_ip, **labels)


def generated(kind: str, name: str) -> str:
    """The name kustomize gave a generated ConfigMap or Secret (``name-<hash>``)."""
    names = [i["metadata"]["name"] for i in get(kind)["items"] if i["metadata"]["name"].startswith(name + "-")]
    assert len(names) == 1, (kind, name, names)
    return names[0]


def secret(name: str, key: str) -> str:
    import base64

    return base64.b64decode(get("secret", generated("secret", name))["data"][key]).decode()


# ---------------------------------------------------------------------------------- client pods
def target(component: str) -> str:
    """The component's Service name as a gRPC target (the headless Service: every replica's address)."""
    return f"dns:///{deployment(component)}.{NAMESPACE}.svc.cluster.local:{PORTS[component]}"


def client_pod(name: str, command: list[str], labels: dict[str, str] | None = None, env: dict[str, str] | None = None,
               volumes: list[dict] | None = None, mounts: list[dict] | None = None, workdir: str | None = None,
               reach: tuple[str, ...] = ()) -> dict:
    """A pod of the mailqueue image that runs ``command`` once, with the Service names and the dev
    tokens in its environment and the client scripts in /client; ``reach``: components whose
    Service must answer before the command starts (client pods are new to the policy controller)."""
    svc = {c: target(c) for c in COMPONENTS}
    if reach:
        command = ["python", "/client/reach.py", *(svc[c] for c in reach), "--", *command]
    tokens = generated("secret", "mailqueue-tokens")
    token = lambda role: {"valueFrom": {"secretKeyRef": {"name": tokens, "key": role}}}  # noqa: E731
    container = {
        "name": "client", "image": "mailqueue:latest", "imagePullPolicy": "Never", "command": command,
        "env": [{"name": "MAILQUEUE_ENQUEUE_TARGET", "value": svc["enqueue"]},
                {"name": "MAILQUEUE_DEQUEUE_TARGET", "value": svc["dequeue"]},
                {"name": "MAILQUEUE_BROWSE_TARGET", "value": svc["browse"]},
                {"name": "MAILQUEUE_BLOB_TARGET", "value": svc["blob"]},
                {"name": "PRODUCER_TOKEN", **token("producer")}, {"name": "CONSUMER_TOKEN", **token("consumer")},
                {"name": "MAILQUEUE_TOKEN", **token("admin")}, {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": "MAILQUEUE_TLS_CA", "value": "/ca/ca.crt"}, {"name": "MAILQ_TLS_CA", "value": "/ca/ca.crt"},
                *({"name": k, "value": v} for k, v in (env or {}).items())],
        "volumeMounts": [{"name": "client", "mountPath": "/client"}, {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "ca", "mountPath": "/ca", "readOnly": True}, *(mounts or [])],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    if workdir:
        container["workingDir"] = workdir
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mailqueue-test-client", **(labels or {})}},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 5,
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [container],
                 "volumes": [{"name": "client", "configMap": {"name": "mailqueue-test-client"}},
                             {"name": "tmp", "emptyDir": {}},
                             # The CA only (not the services' key): what a client needs to trust them.
                             {"name": "ca", "secret": {"secretName": "mailqueue-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                             *(volumes or [])]},
    }


def install_client_scripts() -> None:
    data = {}
    for script in ("client.py", "reach.py"):
        with open(os.path.join(ROOT, "tests", "kubernetes", script), encoding="utf-8") as f:
            data[script] = f.read()
    apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mailqueue-test-client"}, "data": data}])


def run_pod(pod: dict, timeout: float = 300) -> tuple[str, str]:
    """Create the pod, wait for it to end; (its phase, its log)."""
    name = pod["metadata"]["name"]
    ns("delete", "pod", name, "--ignore-not-found", "--wait=true")
    apply([pod])
    phase = wait_until(lambda: get("pod", name).get("status", {}).get("phase") in ("Succeeded", "Failed") and
                       get("pod", name)["status"]["phase"], timeout, interval=1, what=f"pod {name} to end")
    return phase, ns("logs", name).stdout


def run_pods(pods: list[dict], timeout: float = 300) -> list[tuple[str, str]]:
    """``run_pod`` for several pods at once (created together, so they run side by side); (phase,
    log) of each, in order."""
    names = [p["metadata"]["name"] for p in pods]
    ns("delete", "pod", *names, "--ignore-not-found", "--wait=true")
    apply(pods)
    ended = lambda name: get("pod", name).get("status", {}).get("phase") in ("Succeeded", "Failed")  # noqa: E731
    wait_until(lambda: all(ended(n) for n in names), timeout, interval=1, what=f"pods {names} to end")
    return [(get("pod", n)["status"]["phase"], ns("logs", n).stdout) for n in names]


def start_pod(pod: dict) -> str:
    name = pod["metadata"]["name"]
    ns("delete", "pod", name, "--ignore-not-found", "--wait=true")
    apply([pod])
    wait_until(lambda: get("pod", name).get("status", {}).get("phase") in ("Running", "Succeeded", "Failed"), 120,
               interval=0.5, what=f"pod {name} running")
    return name


def finish_clients(names: list[str], timeout: float = 400) -> list[dict]:
    """Stop the client pods' producers (all at once), wait for their drains; the JSON record each printed last."""
    for name in names:
        ns("exec", name, "--", "touch", "/tmp/stop")
    records = []
    for name in names:
        wait_until(lambda: get("pod", name)["status"]["phase"] in ("Succeeded", "Failed"), timeout, interval=1,
                   what=f"client {name} to finish")
        log = ns("logs", name).stdout
        records.append(json.loads(log.strip().splitlines()[-1]))
        ns("delete", "pod", name, "--ignore-not-found", "--wait=false")
    return records


def finish_client(name: str, timeout: float = 400) -> dict:
    return finish_clients([name], timeout)[0]


def view_states(queue: str, enqueue_ids: list[str]) -> list[str]:
    """What the view says of these mails (keyspace of the overlay): for a failure's message."""
    import uuid

    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    cluster, session = connect(cassandra_from_env({**os.environ, "MAILQUEUE_CASSANDRA_KEYSPACE": "mailqueue_kube"}))
    try:
        out = []
        for eid in enqueue_ids[:10]:
            rows = list(session.execute("SELECT reason, deleted_at FROM deleted_mails_v1 WHERE queue_name=%s AND enqueue_id=%s",
                                        (queue, uuid.UUID(eid))))
            out.append(f"{eid}: {[(r.reason, str(r.deleted_at)) for r in rows] or 'live'}")
        return out
    finally:
        cluster.shutdown()


def host_pid(pod: dict) -> int:
    """The host PID of the pod's (first) container's main process, from containerd (crictl)."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    crictl = os.path.join(os.environ.get("MAILQUEUE_CACHE_DIR", os.path.expanduser("~/.cache/mailqueue-stack")),
                          "kubernetes-v1.34.4", "bin", "crictl")
    out = subprocess.run([crictl, "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "inspect", container_id],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)["info"]["pid"])


def restart_evidence(pod: dict, lines: int = 40) -> str:
    """Why a pod's container restarted: its whole last state (exit code, reason, times) and the
    last lines the previous container wrote (kubectl logs --previous), for a failure message."""
    name = pod["metadata"]["name"]
    states = [f"{s['name']}: restartCount={s.get('restartCount')} lastState={json.dumps(s.get('lastState', {}))}"
              for s in pod["status"].get("containerStatuses", [])]
    previous = ns("logs", name, "--previous", f"--tail={lines}", check=False, timeout=30)
    return "\n".join([f"pod {name}", *states, "previous container's last lines:",
                      previous.stdout.strip() or previous.stderr.strip() or "(none)"])


def restarts(pod_name: str) -> int:
    return get("pod", pod_name)["status"]["containerStatuses"][0]["restartCount"]


def acked_so_far(name: str) -> int:
    """The acknowledged mails a running client pod reported last ("client: N acked, ...")."""
    import re

    counts = re.findall(r"^client: (\d+) acked", ns("logs", name).stdout, re.M)
    return int(counts[-1]) if counts else 0
