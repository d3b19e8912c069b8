"""Offline checks of the Kubernetes manifests: every overlay renders, validates against the
schemas of a stated Kubernetes version, and follows the suite's policy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from stack.harness import ROOT

KUBERNETES_VERSION = "1.31.0"
OVERLAYS = ["dev", "prod", "local"]
SERVICES = {"enqueue": 50051, "dequeue": 50052, "browse": 50053, "blob": 50054}
#: Deployments of one replica that must never run two pods (no HPA, no PDB): one deliverer per webhook checkpoint.
SINGLETONS = {"webhook": 50055}


def kustomize() -> str:
    path = os.environ.get("KUSTOMIZE") or shutil.which("kustomize")
    if not path:
        pytest.fail("kustomize not found: run `make kustomize` (go install sigs.k8s.io/kustomize/kustomize/v5)")
    return path


def render(overlay: str) -> str:
    return subprocess.run([kustomize(), "build", os.path.join(ROOT, "k8s", "overlays", overlay)],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request, tmp_path_factory):
    text = render(request.param)
    path = tmp_path_factory.mktemp(request.param) / "all.yaml"
    path.write_text(text)
    docs = [d for d in yaml.safe_load_all(text) if d]
    return request.param, path, docs


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def test_validates_against_the_kubernetes_schemas(rendered):
    _, path, _ = rendered
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version",
                        KUBERNETES_VERSION, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_deployment_is_probed_limited_and_hardened(rendered):
    overlay, _, docs = rendered
    deployments = of_kind(docs, "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {f"mailqueue-{s}" for s in {**SERVICES, **SINGLETONS}}
    for d in deployments:
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            # The API serves TLS only; the probes ask the plaintext health-only port.
            env = {e["name"]: e.get("value") for e in c["env"]}
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert env["MAILQUEUE_TLS_CERT_FILE"] and env["MAILQUEUE_TLS_KEY_FILE"] and "MAILQUEUE_PLAINTEXT" not in env
            assert int(env["MAILQUEUE_HEALTH_PORT"]) == ports["health"] != ports["grpc"]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                assert c[probe]["grpc"]["port"] == ports["health"], (d["metadata"]["name"], probe)
            # Certificates and credentials: whole Secrets, read-only, no subPath (rotation).
            secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
            component = d["metadata"]["name"].removeprefix("mailqueue-")
            assert secrets["tls"].startswith("mailqueue-tls") and secrets["credentials"].startswith(f"mailqueue-{component}-credentials")
            for m in c["volumeMounts"]:
                if m["name"] in secrets:
                    assert m["readOnly"] is True and "subPath" not in m, m
            # A backend outage fails readiness only: liveness and start-up ask the "liveness" name.
            assert "service" not in c["readinessProbe"]["grpc"]
            assert c["livenessProbe"]["grpc"]["service"] == c["startupProbe"]["grpc"]["service"] == "liveness"
            assert c["resources"]["requests"] and c["resources"]["limits"]
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]


def test_every_deployment_has_an_hpa_a_pdb_and_a_headless_service(rendered):
    _, _, docs = rendered
    for d in of_kind(docs, "Deployment"):
        name = d["metadata"]["name"]
        if name.removeprefix("mailqueue-") in SINGLETONS:
            continue
        hpas = [h for h in of_kind(docs, "HorizontalPodAutoscaler") if h["spec"]["scaleTargetRef"]["name"] == name]
        assert len(hpas) == 1 and hpas[0]["apiVersion"] == "autoscaling/v2"
        labels = d["spec"]["template"]["metadata"]["labels"]
        pdbs = [p for p in of_kind(docs, "PodDisruptionBudget")
                if all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
        assert len(pdbs) == 1, name
        services = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == name]
        assert services and services[0]["spec"]["clusterIP"] == "None"


def test_the_sweep_never_overlaps_and_keeps_a_short_history(rendered):
    _, _, docs = rendered
    [cron] = of_kind(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert cron["spec"]["successfulJobsHistoryLimit"] <= 5 and cron["spec"]["failedJobsHistoryLimit"] <= 5
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"] == "mailqueue-sweep"


def test_the_sweep_runs_the_spark_job_from_its_own_image_writing_only_to_tmp(rendered):
    overlay, _, docs = rendered
    [cron] = of_kind(docs, "CronJob")
    [container] = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["python", "-m", "spark.sweep"]
    assert container["image"].split("/")[-1].startswith("mailqueue-sweep:")
    if overlay == "prod":
        assert container["image"] == "registry.example.com/mailqueue-sweep:0.1.0"
    summary = container["args"][container["args"].index("--summary-file") + 1]
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert container["securityContext"]["readOnlyRootFilesystem"] and any(summary.startswith(m + "/") for m in mounts)


def test_the_admin_service_is_reachable_only_where_the_overlay_says(rendered):
    overlay, _, docs = rendered
    [policy] = [p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "mailqueue-admin"]
    sources = policy["spec"]["ingress"][0]["from"]
    if overlay == "prod":
        assert sources == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                            "podSelector": {"matchLabels": {"mailqueue-admin": "true"}}}]
    else:  # dev and local keep base's: labelled pods of the namespace only
        assert sources == [{"podSelector": {"matchLabels": {"mailqueue-admin": "true"}}}]


def test_enqueue_and_dequeue_reach_s3_themselves_and_connections_are_rebalanced(rendered):
    """No blob_svc hop for mail content (the default, MAILQUEUE_BLOB_TARGET unset): every service
    gets the S3 endpoint and keys; clients reconnect (and re-resolve) as connections age out."""
    _, _, docs = rendered
    [config] = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].startswith("mailqueue-config")]
    assert "MAILQUEUE_BLOB_TARGET" not in config["data"] and config["data"]["MAILQUEUE_S3_ENDPOINT"]
    for d in of_kind(docs, "Deployment"):
        if d["metadata"]["name"].endswith(("enqueue", "dequeue")):
            [container] = d["spec"]["template"]["spec"]["containers"]
            refs = [r.get("secretRef", r.get("configMapRef", {})).get("name", "") for r in container["envFrom"]]
            assert any(ref.startswith("mailqueue-config") for ref in refs), d["metadata"]["name"]  # the S3 endpoint
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["MAILQUEUE_CREDENTIALS_DIR"] and env["MAILQUEUE_S3_CA_FILE"]  # its own keys, over TLS
    assert int(config["data"]["MAILQUEUE_MAX_CONNECTION_AGE_S"]) > 0


def test_webhook_svc_runs_alone_and_reaches_only_dns_the_backends_and_http(rendered):
    """One deliverer per endpoint checkpoint: one replica, Recreate (never two pods), no HPA; egress
    only to DNS, Cassandra, RabbitMQ and HTTP(S) (never link-local addresses); no ingress but the metrics scrape."""
    _, _, docs = rendered
    [d] = [x for x in of_kind(docs, "Deployment") if x["metadata"]["name"] == "mailqueue-webhook"]
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    assert not [h for h in of_kind(docs, "HorizontalPodAutoscaler") if h["spec"]["scaleTargetRef"]["name"] == "mailqueue-webhook"]
    assert d["spec"]["template"]["spec"]["serviceAccountName"] == "mailqueue-webhook"
    labels = d["spec"]["template"]["metadata"]["labels"]

    def selects(p):  # noqa: ANN001, ANN202
        sel = p["spec"]["podSelector"]
        return all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items()) and not sel.get("matchExpressions")

    policies = [p for p in of_kind(docs, "NetworkPolicy") if selects(p)]
    egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"]]
    assert len(egress) == 1
    ports = sorted((port["protocol"], port["port"]) for rule in egress[0]["spec"]["egress"] for port in rule["ports"])
    assert ports == [("TCP", 53), ("TCP", 80), ("TCP", 443), ("TCP", 5671), ("TCP", 5672), ("TCP", 9042), ("UDP", 53)]
    # the endpoints' rule: any address but link-local ones (the instance metadata service)
    blocks = [t["ipBlock"] for rule in egress[0]["spec"]["egress"] for t in rule.get("to", []) if "ipBlock" in t]
    assert blocks and all("169.254.0.0/16" in b.get("except", []) for b in blocks)
    ingress = [rule for p in policies if "Ingress" in p["spec"]["policyTypes"] for rule in p["spec"].get("ingress", [])]
    assert [port["port"] for rule in ingress for port in rule["ports"]] == ["metrics"]
