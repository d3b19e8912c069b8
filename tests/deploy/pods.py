"""The Kubernetes manifests as podman runs them: render an overlay, adapt only what podman cannot
take, play it against the local stack, tear it down.

What is adapted, and why (the README's "Deploying" section repeats it):

* kinds podman does not run are left out: Service, HorizontalPodAutoscaler, PodDisruptionBudget,
  NetworkPolicy, ServiceAccount (tests/k8s validates them offline); the CronJob becomes one Pod
  from its job template, run on demand (:func:`play_sweep`), as ``kubectl create job --from`` does.
* Secrets: podman 4.3 stores a ``kind: Secret`` of the YAML as YAML but reads it back as JSON, so
  each one is created beforehand with ``podman secret create`` from its ``data`` as written.
* Services and cluster DNS: podman has neither. Every pod gets ``hostAliases`` that send the
  ``*.svc.cluster.local`` names of the ConfigMap and Secrets to 10.0.2.2, the host's loopback as
  slirp4netns shows it to a pod (``--network slirp4netns:allow_host_loopback=true``), and every
  container port is published on the host's 127.0.0.1 (``hostPort``): a pod reaches the backends of
  the local stack and the other pods on their usual ports, the tests reach the pods on loopback.
* A Deployment of N replicas becomes N Deployments of one replica (podman makes N pods, whose host
  ports would collide); replica i publishes each port + 100 i.
* ``emptyDir``: podman 4.3 makes one named volume per volume name, shared by every pod that uses
  the name; each pod's volume is renamed ``<pod>-<volume>`` so it stays its own.
* ``imagePullPolicy: Never``: the images are the ones ``make image`` built; there is no registry.
* The S3 keys of ``mailqueue-backends`` become the local MinIO's (it has only its root user). The
  RabbitMQ user of the Secret is created in the local RabbitMQ instead (:func:`provision_backends`).

Run by hand: ``python -m tests.deploy.pods up`` (then ``down``); ``render`` prints what is played.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import urllib.parse

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORK = os.path.join(os.environ.get("MAILQUEUE_STACK_DIR", os.path.join(ROOT, ".stack")), "deploy")
#: The host's loopback as slirp4netns shows it to a pod.
HOST_FROM_POD = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"
REPLICA_PORT_STEP = 100
NOT_RUN = ("Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "ServiceAccount")
CLUSTER_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?\.svc\.cluster\.local")


@dataclasses.dataclass
class Rendered:
    #: What ``podman kube play`` gets: the ConfigMaps and the (split) Deployments.
    play: list[dict]
    #: Secret name -> its data (base64 values, as written), for ``podman secret create``.
    secrets: dict[str, dict[str, str]]
    #: The CronJob's job as a Pod, played on demand.
    sweep: dict | None
    #: Component ("enqueue", ...) -> the host addresses of its gRPC port, one per replica.
    targets: dict[str, list[str]]
    #: Component -> the host addresses of its metrics port, one per replica.
    metrics: dict[str, list[str]]
    #: Component -> the pod names of its replicas.
    pods: dict[str, list[str]]
    #: "Kind/name" of every document left out.
    not_run: list[str]

    def secret_value(self, secret: str, key: str) -> str:
        """A value of a Secret, by the name the overlay gives it (kustomize appends a hash)."""
        (name,) = [n for n in self.secrets if n == secret or re.fullmatch(re.escape(secret) + r"-[a-z0-9]{10}", n)]
        return base64.b64decode(self.secrets[name][key]).decode()


def kustomize(overlay: str) -> str:
    exe = os.environ.get("KUSTOMIZE") or os.path.expanduser("~/.cache/mailqueue-stack/kustomize-v5.7.1/kustomize")
    return subprocess.run([exe, "build", os.path.join(ROOT, "k8s", "overlays", overlay)],
                          check=True, capture_output=True, text=True).stdout


def local_s3_keys() -> tuple[str, str]:
    """The local MinIO's keys (stack/stack.sh: MAILQUEUE_S3_ACCESS_KEY/SECRET_KEY, default minioadmin)."""
    return (os.environ.get("MAILQUEUE_S3_ACCESS_KEY", "minioadmin"), os.environ.get("MAILQUEUE_S3_SECRET_KEY", "minioadmin"))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _adapt_pod(spec: dict, pod: str, aliases: list[str], replica: int = 0) -> None:
    spec["hostAliases"] = [{"ip": HOST_FROM_POD, "hostnames": aliases}]
    renamed = {}
    for volume in spec.get("volumes", []):
        if "emptyDir" in volume:
            renamed[volume["name"]] = volume["name"] = f"{pod}-{volume['name']}"
    for c in spec["containers"]:
        c["imagePullPolicy"] = "Never"
        for port in c.get("ports", []):
            port["hostPort"] = port["containerPort"] + REPLICA_PORT_STEP * replica
            port["hostIP"] = "127.0.0.1"
        for mount in c.get("volumeMounts", []):
            mount["name"] = renamed.get(mount["name"], mount["name"])


def render(text: str, replicas: dict[str, int] | None = None) -> Rendered:
    """Adapt a rendered overlay for podman. ``replicas``: component -> replicas, overriding the
    overlay's (as its HorizontalPodAutoscaler would)."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    secrets = {d["metadata"]["name"]: dict(d.get("data", {})) for d in docs if d["kind"] == "Secret"}
    configs = [d for d in docs if d["kind"] == "ConfigMap"]
    values = [v for c in configs for v in c.get("data", {}).values()]
    values += [base64.b64decode(v).decode() for data in secrets.values() for v in data.values()]
    aliases = sorted({m.group(0) for v in values for m in CLUSTER_NAME.finditer(v)})
    access, secret = local_s3_keys()
    for data in secrets.values():
        if "MAILQUEUE_S3_ACCESS_KEY" in data:
            data.update(MAILQUEUE_S3_ACCESS_KEY=_b64(access), MAILQUEUE_S3_SECRET_KEY=_b64(secret))
    play: list[dict] = list(configs)
    targets: dict[str, list[str]] = {}
    metrics: dict[str, list[str]] = {}
    pods: dict[str, list[str]] = {}
    sweep = None
    for d in docs:
        if d["kind"] == "Deployment":
            component = d["metadata"]["labels"]["app.kubernetes.io/component"]
            n = (replicas or {}).get(component, d["spec"].get("replicas", 1))
            for i in range(n):
                copy_ = copy.deepcopy(d)
                name = d["metadata"]["name"] if i == 0 else f"{d['metadata']['name']}-{i}"
                copy_["metadata"]["name"] = name
                copy_["spec"]["replicas"] = 1
                _adapt_pod(copy_["spec"]["template"]["spec"], name, aliases, i)
                play.append(copy_)
                pods.setdefault(component, []).append(f"{name}-pod-0")
                for port in copy_["spec"]["template"]["spec"]["containers"][0]["ports"]:
                    into = targets if port["name"] == "grpc" else metrics
                    into.setdefault(component, []).append(f"127.0.0.1:{port['hostPort']}")
        elif d["kind"] == "CronJob":
            template = copy.deepcopy(d["spec"]["jobTemplate"]["spec"]["template"])
            name = f"{d['metadata']['name']}-manual"
            _adapt_pod(template["spec"], name, aliases)
            sweep = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
                     "spec": template["spec"]}
    not_run = [f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["kind"] in NOT_RUN]
    return Rendered(play, secrets, sweep, targets, metrics, pods, not_run)


# ---------------------------------------------------------------------------------- podman
def podman(*args: str, check: bool = True, timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def provision_backends(rendered: Rendered) -> None:
    """What an operator sets up in the backends for this overlay: its RabbitMQ user."""
    for data in rendered.secrets.values():
        url = data.get("MAILQUEUE_RABBITMQ_URL")
        if not url:
            continue
        u = urllib.parse.urlparse(base64.b64decode(url).decode())
        user, password = urllib.parse.unquote(u.username or ""), urllib.parse.unquote(u.password or "")
        vhost = urllib.parse.unquote(u.path[1:] or "/")
        ctl = [os.path.join(ROOT, "stack", "stack.sh"), "rabbitmqctl"]
        if subprocess.run([*ctl, "authenticate_user", user, password], capture_output=True).returncode != 0:
            subprocess.run([*ctl, "delete_user", user], capture_output=True)
            subprocess.run([*ctl, "add_user", user, password], check=True, capture_output=True)
        subprocess.run([*ctl, "set_permissions", "-p", vhost, user, ".*", ".*", ".*"], check=True, capture_output=True)


def _write(name: str, docs: list[dict]) -> str:
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, name)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return path


def up(rendered: Rendered) -> str:
    """Create the Secrets, play the pods (replacing earlier ones); the played file's path."""
    provision_backends(rendered)
    for name, data in rendered.secrets.items():
        podman("secret", "rm", name, check=False)
        podman("secret", "create", name, "-", stdin=json.dumps(data))
    path = _write("play.yaml", rendered.play)
    podman("kube", "play", "--replace", "--network", NETWORK, path)
    return path


def play_sweep(rendered: Rendered) -> str:
    """The sweep's pod, once; the container's name."""
    assert rendered.sweep is not None, "the overlay has no CronJob"
    configs = [d for d in rendered.play if d["kind"] == "ConfigMap"]
    path = _write("sweep.yaml", [*configs, rendered.sweep])
    podman("kube", "play", "--replace", "--network", NETWORK, path)
    return f"{rendered.sweep['metadata']['name']}-{rendered.sweep['spec']['containers'][0]['name']}"


def down() -> None:
    """Remove what :func:`up` and :func:`play_sweep` made (pods by their labels, then the Secrets
    and volumes named mailqueue-*): works without the rendered overlay, after an interrupted run."""
    for name in ("mailqueue", "mailqueue-sweep"):
        ids = podman("pod", "ls", "-q", "--filter", f"label=app.kubernetes.io/name={name}").stdout.split()
        if ids:
            podman("pod", "rm", "--force", "--time", "2", *ids, check=False, timeout=120)
    for kind in ("secret", "volume"):
        names = [n for n in podman(kind, "ls", "--format", "{{.Name}}").stdout.split() if n.startswith("mailqueue-")]
        if names:
            podman(kind, "rm", *(["--force"] if kind == "volume" else []), *names, check=False)


def container(pod: str) -> str:
    """The service container of a pod (podman names it <pod>-<container>)."""
    names = podman("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}").stdout.split()
    ours = [n for n in names if not n.endswith("-infra")]
    assert len(ours) == 1, (pod, names)
    return ours[0]


def inspect(name: str) -> dict:
    return json.loads(podman("inspect", name).stdout)[0]


def main(argv: list[str]) -> int:
    if argv[:1] == ["down"]:
        down()
        return 0
    rendered = render(kustomize(os.environ.get("MAILQUEUE_OVERLAY", "dev")))
    if argv[:1] == ["render"]:
        yaml.safe_dump_all(rendered.play + ([rendered.sweep] if rendered.sweep else []), sys.stdout, sort_keys=False)
    elif argv[:1] == ["up"]:
        up(rendered)
        print(json.dumps({"grpc": rendered.targets, "metrics": rendered.metrics, "not run": rendered.not_run}, indent=1))
    else:
        print("usage: python -m tests.deploy.pods render|up|down", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
