"""Offline checks of the local cluster's own manifests (stack/kube/manifests: the add-ons and the
objects of `kube.sh check`) as kube.sh stages them, and of the scripts' shape: manifests live in
files, not in shell, and no shell file of stack/ passes 400 lines."""

from __future__ import annotations

import base64
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from stack.harness import ROOT
from tests.kubernetes.manifests.test_manifests import kustomize

KUBE = pathlib.Path(ROOT) / "stack" / "kube"
#: The version `stack/kube/build.sh` builds (lib.sh's KUBE_VERSION), for the schemas.
KUBERNETES_VERSION = "1.34.0"
KUSTOMIZATIONS = ["addons", "check", "check-policy", "check-python"]


def lib(*names: str) -> dict[str, str]:
    """The values of shell variables after sourcing stack/kube/lib.sh (and check.sh)."""
    script = f"source {KUBE}/lib.sh; source {KUBE}/check.sh; " + "; ".join(f'echo "${n}"' for n in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines(), strict=True))


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """stage_manifests (lib.sh) run against a stand-in PKI, each kustomization rendered."""
    stack = tmp_path_factory.mktemp("stack")
    pki = stack / "kube" / "pki"
    pki.mkdir(parents=True)
    for name in ("ca.crt", "metrics-server.crt", "metrics-server.key"):
        (pki / name).write_text(f"stand-in {name}\n")
    env = {**os.environ, "MAILQUEUE_STACK_DIR": str(stack)}
    subprocess.run(["bash", "-c", f"set -euo pipefail; source {KUBE}/lib.sh; stage_manifests"], env=env, check=True)
    rendered = {}
    for k in KUSTOMIZATIONS:
        text = subprocess.run([kustomize(), "build", str(stack / "kube" / "manifests" / k)],
                              capture_output=True, text=True, check=True).stdout
        path = stack / f"{k}.yaml"
        path.write_text(text)
        rendered[k] = (path, [d for d in yaml.safe_load_all(text) if d])
    return pki, rendered


def test_validates_against_the_kubernetes_schemas(staged):
    _, rendered = staged
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
                        KUBERNETES_VERSION, *(str(path) for path, _ in rendered.values())], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_machines_values_reach_the_objects_and_stay_off_the_cluster(staged):
    pki, rendered = staged
    values = lib("COREDNS_IMAGE", "METRICS_SERVER_IMAGE", "NETTEST_IMAGE", "DNS_IP")
    docs = {(d["kind"], d["metadata"]["name"]): d for _, ds in rendered.values() for d in ds}
    assert ("ConfigMap", "cluster-values") not in docs  # local-config: read by kustomize only

    def image(kind, name, container):
        [c] = [c for c in docs[(kind, name)]["spec"]["template"]["spec"]["containers"] if c["name"] == container]
        return c["image"]

    assert image("Deployment", "coredns", "coredns") == values["COREDNS_IMAGE"]
    assert image("Deployment", "metrics-server", "metrics-server") == values["METRICS_SERVER_IMAGE"]
    assert docs[("Service", "kube-dns")]["spec"]["clusterIP"] == values["DNS_IP"]
    ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    assert docs[("APIService", "v1beta1.metrics.k8s.io")]["spec"]["caBundle"] == ca
    secret = docs[("Secret", "metrics-server-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.key"]) == (pki / "metrics-server.key").read_bytes()
    for name in ("server", "allowed", "denied"):
        assert docs[("Pod", name)]["spec"]["containers"][0]["image"] == values["NETTEST_IMAGE"]


def test_nothing_is_pulled_and_dns_answers_cluster_names_only(staged):
    _, rendered = staged
    docs = [d for _, ds in rendered.values() for d in ds]
    pods = [d["spec"] for d in docs if d["kind"] == "Pod"]
    pods += [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    containers = [c for p in pods for c in p["containers"]]
    assert len(containers) == 6 and {c["imagePullPolicy"] for c in containers} == {"Never"}  # no registry here
    [corefile] = [d["data"]["Corefile"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "coredns"]
    assert "kubernetes cluster.local" in corefile and "forward" not in corefile  # nothing to the host's resolver


def test_the_check_stays_in_its_own_namespace(staged):
    """check.sh deletes CHECK_NS at its end: every object it applies must live there."""
    _, rendered = staged
    ns = lib("CHECK_NS")["CHECK_NS"]
    docs = [d for k in KUSTOMIZATIONS if k.startswith("check") for d in rendered[k][1]]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"] == [ns]
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] != "Namespace"} == {ns}
    [python] = [d for d in docs if d["metadata"]["name"] == "python"]
    assert f"server.{ns}.svc.cluster.local" in python["spec"]["containers"][0]["command"][2]


def test_no_manifest_in_a_script_and_no_script_over_400_lines():
    scripts = sorted((pathlib.Path(ROOT) / "stack").rglob("*.sh"))
    assert len(scripts) > 10
    for script in scripts:
        text = script.read_text()
        assert len(text.splitlines()) <= 400, f"{script}: {len(text.splitlines())} lines (split it by job)"
        assert "apiVersion:" not in text, f"{script}: a manifest belongs in stack/kube/manifests/"
