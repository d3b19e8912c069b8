"""Contract tests drive the four services (and webhook_svc) on their default ports, as a client in any language would.

The services are the ones `make run` starts (stack/services.sh); they are started here when down.
They serve TLS with the local CA's certificate (.stack/pki/ca.crt, what clients trust).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from stack.harness import ROOT, is_serving

TARGETS = {"enqueue": "localhost:50051", "dequeue": "localhost:50052", "browse": "localhost:50053", "blob": "localhost:50054"}
#: webhook_svc, which `make run` starts too (it serves health, reflection and metrics only).
WEBHOOK = "localhost:50055"
CA = os.path.join(ROOT, ".stack", "pki", "ca.crt")
TOOLS = os.path.join(os.environ.get("MAILQUEUE_CACHE_DIR") or os.path.expanduser("~/.cache/mailqueue-stack"), "go-tools")


def credentials():  # noqa: ANN201
    import grpc

    with open(CA, "rb") as f:
        return grpc.ssl_channel_credentials(f.read())


@pytest.fixture(scope="session")
def services(running_stack: None) -> dict[str, str]:
    if not all(is_serving(t, credentials()) for t in (*TARGETS.values(), WEBHOOK)):
        r = subprocess.run([os.path.join(ROOT, "stack", "services.sh"), "start"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"stack/services.sh start failed:\n{r.stdout}\n{r.stderr}")
    return TARGETS


def tool(name: str) -> str:
    path = os.path.join(TOOLS, name)
    if not os.path.exists(path):
        pytest.fail(f"{name} is missing: run `make contract` (go install into {TOOLS})")
    return path


#: Shell blocks of the docs per page: (run, skipped), filled by test_docs_blocks.py.
DOCS_BLOCKS: dict[str, tuple[int, int]] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The docs test's totals: how many shell blocks ran as pasted, how many are marked skip."""
    if DOCS_BLOCKS:
        ran = sum(r for r, _ in DOCS_BLOCKS.values())
        skipped = sum(s for _, s in DOCS_BLOCKS.values())
        terminalreporter.write_line(f"docs shell blocks: {ran} run, {skipped} skipped (marked), in {len(DOCS_BLOCKS)} page(s)")
