"""The README's grpcurl block, run command by command against the running services."""

import os
import re
import subprocess

from tests.contract.conftest import tool
from tests.harness import ROOT


def readme_commands() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Every RPC from a shell (grpcurl)", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith("grpcurl ")]


def test_every_rpc_has_a_command():
    commands = " ".join(readme_commands())
    rpcs = {
        "EnqueueService": ["Enqueue", "EnqueueStream"], "DequeueService": ["Dequeue"],
        "BrowseService": ["ListQueues", "GetQueue", "Browse", "GetSize"],
        "AdminService": ["CreateQueue", "DeleteMails", "ClearQueue", "Flush", "RepublishNotProcessed",
                         "UpdateBrowseStart", "GetConfiguration", "UpdateConfiguration"],
        "BlobService": ["Put", "PutBytes", "Get", "GetBytes", "Stat", "Delete"],
    }
    for service, methods in rpcs.items():
        for m in methods:
            assert f"mailqueue.v1.{service}/{m} " in commands + " ", f"{service}/{m} has no grpcurl example"


def test_the_readme_commands_run(services):
    grpcurl = tool("grpcurl")
    outputs = []
    for command in readme_commands():
        r = subprocess.run(["bash", "-c", command.replace("grpcurl ", f"{grpcurl} ", 1)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout)
    joined = "\n".join(outputs)
    assert "mailqueue.v1.EnqueueService" in joined and '"enqueue_id"' in joined and '"SERVING"' in joined
