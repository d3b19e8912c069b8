"""The grpcurl block of the docs (docs/pages/reference/grpcurl.md), run command by command against
the running services."""

import os
import re
import subprocess

from tests.contract.conftest import tool
from tests.harness import ROOT

PAGE = os.path.join(ROOT, "docs", "pages", "reference", "grpcurl.md")


def readme_commands() -> list[str]:
    with open(PAGE) as f:
        text = f.read()
    section = text.split("# Every RPC from a shell (grpcurl)", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("grpcurl ")]


def test_every_rpc_has_a_command():
    from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2

    commands = " ".join(readme_commands()) + " "
    for module in (admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2):  # every RPC of the contract
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert f"{service.full_name}/{m.name} " in commands, f"{service.full_name}/{m.name} has no grpcurl example"


def test_the_readme_commands_run(services):
    grpcurl = tool("grpcurl")
    outputs = []
    for command in readme_commands():
        r = subprocess.run(["bash", "-c", command.replace("grpcurl ", f"{grpcurl} ", 1)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout)
    joined = "\n".join(outputs)
    assert "mailqueue.v1.EnqueueService" in joined and '"enqueue_id"' in joined and '"SERVING"' in joined
