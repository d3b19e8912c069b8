"""The Kubernetes tier: the local overlay applied with ``kubectl apply -k`` on the single-node
cluster of stack/kube/kube.sh (``make kube-up``), against the local stack (``make up``).

Setup, as an operator's first deployment: the namespace, the Secrets (stack/kube/kube.sh secrets:
the services' certificate in cert-manager's shape, one backend credential per component),
``kubectl apply -k``. The namespace of an
earlier run is deleted first, so every run starts from nothing.

``manifests/`` beside it holds the offline checks of the same manifests (marker ``k8s``, ``make
test-k8s``: kustomize and the schemas, no cluster); they use none of these fixtures.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator

import pytest

from stack.harness import stack_whole, wait_until
from tests.kubernetes import kube


@dataclasses.dataclass
class Applied:
    #: Seconds from `kubectl apply -k` to each Deployment Available.
    available_s: dict[str, float]
    apply_s: float


@pytest.fixture(scope="package")
def cluster(running_stack: None) -> Iterator[None]:
    """The cluster of stack/kube/kube.sh, with the images imported. Started when it is down, and
    then stopped after the tier (``make test`` starts it only here, so it does not idle through
    the other tiers); a cluster that was up already (``make kube-up``) is left running."""
    started = subprocess.run([kube.KUBE, "status"], capture_output=True).returncode != 0
    try:
        if started:
            r = subprocess.run([kube.KUBE, "up"], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.fail(f"stack/kube/kube.sh up failed:\n{r.stderr[-3000:]}")
            print(f"\n[kubernetes] stack/kube/kube.sh up: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'done'}")
        r = subprocess.run([kube.KUBE, "import-images"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"stack/kube/kube.sh import-images failed (run `make image` first):\n{r.stderr[-3000:]}")
        yield
    finally:
        if started:  # also after a start that failed half-way: down stops what up left
            subprocess.run([kube.KUBE, "down"], capture_output=True, text=True)


@pytest.fixture(scope="package")
def applied(cluster: None) -> Applied:
    # The pods use the local stack: whatever the outage tests before left down is started first.
    stack_whole("kubernetes")
    if kube.kubectl("get", "namespace", kube.NAMESPACE, check=False).returncode == 0:
        print(f"[kubernetes] deleting the namespace {kube.NAMESPACE} of an earlier run")
        kube.kubectl("delete", "namespace", kube.NAMESPACE, "--wait=true", timeout=300)
    kube.kubectl("create", "namespace", kube.NAMESPACE)
    # The Secrets first, as cert-manager and the operator's secrets manager would: the services'
    # certificate and one backend credential per component (users and roles that stack/stack.sh
    # up made in the backends).
    subprocess.run([kube.KUBE, "secrets", kube.NAMESPACE], check=True, capture_output=True)
    start = time.monotonic()
    kube.kubectl("apply", "-k", kube.OVERLAY, timeout=180)
    apply_s = round(time.monotonic() - start, 2)
    kube.install_client_scripts()
    available_s: dict[str, float] = {}

    def all_available() -> bool:
        for c in kube.DEPLOYMENTS:
            if c not in available_s and kube.available(c):
                available_s[c] = round(time.monotonic() - start, 1)
        return len(available_s) == len(kube.DEPLOYMENTS)

    try:
        wait_until(all_available, 240, interval=1, what="every Deployment Available")
    except AssertionError as e:
        pods = "; ".join(f"{name} {phase} {why}".strip() for name, phase, why in kube.pod_phases())
        raise AssertionError(f"{e}: available {sorted(available_s)}\npods: {pods}\n{kube.node_state()}") from None
    print(f"[kubernetes] kubectl apply -k: {apply_s} s; Available after (s): {available_s}")
    yield Applied(available_s, apply_s)
    kube.kubectl("delete", "namespace", kube.NAMESPACE, "--wait=false", check=False)


@pytest.fixture(autouse=True)
def no_client_pod_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails or times out half-way leaves its client pods running: load generators
    that would slow every later test of the tier on a 2-core node. They go when the test ends."""
    yield
    if "applied" in request.fixturenames:
        kube.ns("delete", "pod", "-l", "app.kubernetes.io/name=mailqueue-test-client", "--ignore-not-found",
                "--wait=false", check=False, timeout=60)
