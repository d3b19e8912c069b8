"""The deploy tier: the dev overlay, rendered with kustomize, played with podman against the local stack.

Needs the images (`make image`) and the local stack (`make up`). The four services of `make run`
listen on the ports the pods publish, so they are stopped first (and say so).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time

import pytest
from grpc_health.v1 import health_pb2

from tests.deploy import pods
from tests.harness import ROOT, health, wait_until

#: The dev overlay runs one replica of each; enqueue gets two here (its HPA's floor in base), so
#: that a killed pod has a peer.
REPLICAS = {"enqueue": 2}
START_DEADLINE_S = 120
REPORT = os.path.join(pods.WORK, "report.json")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclasses.dataclass
class Deployed:
    rendered: pods.Rendered
    #: Seconds from `podman kube play` to SERVING, per replica target.
    start_s: dict[str, float]
    report: dict

    def token(self, role: str) -> str:
        return self.rendered.secret_value("mailqueue-tokens", role)

    def target(self, component: str) -> str:
        """A gRPC target balancing over every replica, as a headless Service with round_robin does."""
        addresses = self.rendered.targets[component]
        return addresses[0] if len(addresses) == 1 else "ipv4:" + ",".join(addresses)

    def containers(self, component: str) -> list[str]:
        return [pods.container(p) for p in self.rendered.pods[component]]

    def all_serving(self) -> bool:
        return all(health(t) == SERVING for ts in self.rendered.targets.values() for t in ts)


def _check_prerequisites() -> None:
    if not shutil.which("podman"):
        pytest.fail("podman is missing: run `make image` (installs podman and builds the images)")
    for image in ("mailqueue:latest", "mailqueue-sweep:latest"):
        if pods.podman("image", "exists", image, check=False).returncode != 0:
            pytest.fail(f"image {image} is missing: run `make image`")


@pytest.fixture(scope="session")
def deployed(running_stack: None) -> Deployed:
    _check_prerequisites()
    services = os.path.join(ROOT, "stack", "services.sh")
    if subprocess.run([services, "status"], capture_output=True).returncode == 0 or any(
            health(f"127.0.0.1:{p}") != -1 for p in (50051, 50052, 50053, 50054)):
        print("[deploy] stopping the local services (stack/services.sh stop): the pods publish their ports")
        subprocess.run([services, "stop"], check=True, capture_output=True)
    rendered = pods.render(pods.kustomize("dev"), replicas=REPLICAS)
    pods.down()  # what an earlier, interrupted run left
    start = time.monotonic()
    pods.up(rendered)
    played = time.monotonic() - start
    start_s: dict[str, float] = {}

    def started() -> bool:
        for addresses in rendered.targets.values():
            for t in addresses:
                if t not in start_s and health(t) == SERVING:
                    start_s[t] = round(time.monotonic() - start, 2)
        return len(start_s) == sum(map(len, rendered.targets.values()))

    try:
        wait_until(started, START_DEADLINE_S, interval=0.1, what="every pod SERVING")
    except AssertionError:
        logs = {p: pods.podman("logs", "--tail", "20", pods.container(p), check=False).stdout[-1500:]
                for ps in rendered.pods.values() for p in ps}
        pods.down()
        pytest.fail(f"pods not SERVING within {START_DEADLINE_S} s: {start_s}\n{json.dumps(logs, indent=1)}")
    sizes = {i: int(pods.podman("image", "inspect", "--format", "{{.Size}}", i).stdout) for i in ("mailqueue:latest", "mailqueue-sweep:latest")}
    report = {"kube_play_s": round(played, 2), "serving_s": start_s, "image_bytes": sizes, "not_run": rendered.not_run}
    yield Deployed(rendered, start_s, report)
    pods.down()
    os.makedirs(pods.WORK, exist_ok=True)
    with open(REPORT, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
