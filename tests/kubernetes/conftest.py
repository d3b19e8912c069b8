"""The Kubernetes tier: the local overlay applied with ``kubectl apply -k`` on the single-node
cluster of stack/kube/kube.sh (``make kube-up``), against the local stack (``make up``).

Setup, as an operator's first deployment: the namespace, the overlay's backend users (its
RabbitMQ user, its MinIO user with the readwrite policy), ``kubectl apply -k``. The namespace of an
earlier run is deleted first, so every run starts from nothing.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import urllib.parse

import pytest

from tests.harness import ROOT, wait_until
from tests.kubernetes import kube


@dataclasses.dataclass
class Applied:
    #: Seconds from `kubectl apply -k` to each Deployment Available.
    available_s: dict[str, float]
    apply_s: float


def _provision_backends() -> None:
    """The overlay's credentials, created in the local backends (an operator's step)."""
    import os

    from minio import MinioAdmin
    from minio.credentials import StaticProvider

    url = urllib.parse.urlparse(kube.secret("mailqueue-backends", "MAILQUEUE_RABBITMQ_URL"))
    user, password = urllib.parse.unquote(url.username or ""), urllib.parse.unquote(url.password or "")
    ctl = [f"{ROOT}/stack/stack.sh", "rabbitmqctl"]
    if subprocess.run([*ctl, "authenticate_user", user, password], capture_output=True).returncode != 0:
        subprocess.run([*ctl, "delete_user", user], capture_output=True)
        subprocess.run([*ctl, "add_user", user, password], check=True, capture_output=True)
    subprocess.run([*ctl, "set_permissions", "-p", "/", user, ".*", ".*", ".*"], check=True, capture_output=True)

    access = kube.secret("mailqueue-backends", "MAILQUEUE_S3_ACCESS_KEY")
    secret = kube.secret("mailqueue-backends", "MAILQUEUE_S3_SECRET_KEY")
    root_user = os.environ.get("MAILQUEUE_S3_ACCESS_KEY", "minioadmin")
    root_password = os.environ.get("MAILQUEUE_S3_SECRET_KEY", "minioadmin")
    admin = MinioAdmin(endpoint="127.0.0.1:9000", credentials=StaticProvider(root_user, root_password), secure=False)
    admin.user_add(access, secret)
    try:
        admin.attach_policy(["readwrite"], user=access)
    except Exception as e:  # noqa: BLE001 - already attached: MinIO refuses the same policy twice
        if "already" not in str(e).lower():
            raise


@pytest.fixture(scope="session")
def cluster(running_stack: None) -> None:
    """The cluster of stack/kube/kube.sh, started when it is down, with the images imported."""
    if subprocess.run([kube.KUBE, "status"], capture_output=True).returncode != 0:
        r = subprocess.run([kube.KUBE, "up"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"stack/kube/kube.sh up failed:\n{r.stderr[-3000:]}")
    r = subprocess.run([kube.KUBE, "import-images"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"stack/kube/kube.sh import-images failed (run `make image` first):\n{r.stderr[-3000:]}")


@pytest.fixture(scope="session")
def applied(cluster: None) -> Applied:
    if kube.kubectl("get", "namespace", kube.NAMESPACE, check=False).returncode == 0:
        print(f"[kubernetes] deleting the namespace {kube.NAMESPACE} of an earlier run")
        kube.kubectl("delete", "namespace", kube.NAMESPACE, "--wait=true", timeout=300)
    kube.kubectl("create", "namespace", kube.NAMESPACE)
    # The Secrets first (the overlay makes them): the users they name exist before any pod starts.
    start = time.monotonic()
    kube.kubectl("apply", "-k", kube.OVERLAY, timeout=180)
    apply_s = round(time.monotonic() - start, 2)
    _provision_backends()
    kube.install_client_scripts()
    available_s: dict[str, float] = {}

    def all_available() -> bool:
        for c in kube.COMPONENTS:
            if c not in available_s and kube.available(c):
                available_s[c] = round(time.monotonic() - start, 1)
        return len(available_s) == len(kube.COMPONENTS)

    wait_until(all_available, 240, interval=1, what="every Deployment Available")
    print(f"[kubernetes] kubectl apply -k: {apply_s} s; Available after (s): {available_s}")
    yield Applied(available_s, apply_s)
    kube.kubectl("delete", "namespace", kube.NAMESPACE, "--wait=false", check=False)
