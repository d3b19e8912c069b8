"""Every shell block of the docs runs as pasted, in order, against `make run`.

Given the services on their default ports (the ones `make run` starts; started here when down,
as for every contract test) and a shell as a person opens one (no venv, no go tools on PATH, no
MAILQ_* variable, no make of a caller), in the project folder,
when each page's shell blocks run in one fresh bash, in the order of the page (`set -euo pipefail`:
a command that fails fails the page),
then every command succeeds, and the install is as the page found it: the same queues, hold and
bounce rules, throttles, sites, shaping rules and effects, and view configuration.

The blocks are read with pytest-codeblocks' parser (``pytest_codeblocks.extract_from_file``). A
block that must not run there (install steps, a remote cluster, a change to every queue of the
install) has ``<!--pytest.mark.skip(reason="...")-->`` on the line above it; usage notation is a
```` ```text ```` block, not a shell one. The totals (blocks run, blocks skipped) are printed at the
end of the session (tests/contract/conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from pytest_codeblocks import CodeBlock, extract_from_file

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc
from stack.harness import ROOT
from tests.contract.conftest import DOCS_BLOCKS, credentials

DOCS = Path(ROOT) / "docs" / "pages"
#: The pages with shell blocks: README.md, then docs/pages (the generated reference pages have none).
PAGES = [Path(ROOT) / "README.md", *sorted(DOCS.rglob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
#: What a page's run must print besides succeeding (the grpcurl page: an enqueue's receipt, health;
#: mailq by task: its last dequeue finds nothing, as its comment says, and an operator's delete is
#: in the trace that follows it).
EXPECTED = {"docs/pages/reference/grpcurl.md": ['"enqueue_id"', '"SERVING"'],
            "docs/pages/operating/mailq.md": ["exit status 3", "  deleted  "]}
#: Seconds one page may take (under pytest-timeout's 300): mailq by task runs 40 mailq commands and drops two
#: queues (DeleteQueue waits 10 s each).
PAGE_TIMEOUT_S = 280


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def shell_blocks(page: Path) -> tuple[list[CodeBlock], list[CodeBlock]]:
    """(blocks to run, blocks marked skip) of the page's shell blocks, in page order."""
    run: list[CodeBlock] = []
    skipped: list[CodeBlock] = []
    for b in extract_from_file(page):
        if (b.syntax or "").split(" ")[0] in SHELL:
            (skipped if any(m.startswith("pytest.mark.skip") for m in b.marks) else run).append(b)
    return run, skipped


def shell_env() -> dict[str, str]:
    """The environment of a shell a person opens: this one's, less what a test run or a make recipe
    adds (the venv's and the go tools' PATH entries, MAILQ_*/MAILQUEUE_* variables, MAKE*)."""
    drop = ("MAILQ_", "MAILQUEUE_", "MAKE", "MFLAGS", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    path = [p for p in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep)
            if p and ".venv" not in p and "go-tools" not in p]
    env["PATH"] = os.pathsep.join(path)
    return env


def install_state(target: str) -> dict[str, object]:
    """What a page must leave as it found it: the install-wide state of AdminService and BrowseService."""
    with grpc.secure_channel(target, credentials()) as ch:
        browse, admin = browse_pb2_grpc.BrowseServiceStub(ch), admin_pb2_grpc.AdminServiceStub(ch)
        shaping = admin.ListThrottles(admin_pb2.ListThrottlesRequest(), timeout=30)
        config = admin.GetConfiguration(admin_pb2.GetConfigurationRequest(), timeout=30).configuration
        return {
            "queues": sorted(browse.ListQueues(browse_pb2.ListQueuesRequest(), timeout=30).queues),
            "rules": sorted(r.rule_id for r in admin.ListRules(admin_pb2.ListRulesRequest(), timeout=30).rules),
            "throttles": sorted((t.destination, t.queue) for t in shaping.throttles),
            "sites": sorted(s.name for s in shaping.sites),
            "shaping rules": sorted(r.rule_id for r in shaping.rules),
            "effects": sorted(e.destination for e in shaping.effects),
            "configuration": json_format.MessageToDict(config),
        }


def script(blocks: list[CodeBlock]) -> str:
    """The blocks as one bash script; before each, a marker on stderr names its line in the page."""
    parts = ["set -euo pipefail"]
    for b in blocks:
        parts += [f"echo '@@ block at line {b.lineno}' >&2", b.code]
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize("page", [p for p in PAGES if any(shell_blocks(p))], ids=name)
def test_the_shell_blocks_of_a_page_run_as_pasted(services, page):
    run, skipped = shell_blocks(page)
    if not run:
        DOCS_BLOCKS[name(page)] = (0, len(skipped))
        pytest.skip(f"{len(skipped)} block(s), every one marked skip")
    before = install_state(services["browse"])
    r = subprocess.run(["bash", "-c", script(run)], cwd=ROOT, env=shell_env(), capture_output=True, text=True,
                       timeout=PAGE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    markers = re.findall(r"^@@ block at line (\d+)$", r.stderr, re.M)
    assert r.returncode == 0, (f"{name(page)}: the block at line {markers[-1] if markers else '?'} failed "
                               f"(exit {r.returncode})\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
    for text in EXPECTED.get(name(page), []):
        assert text in r.stdout, f"{name(page)}: {text} not in the output\n{r.stdout[-3000:]}"
    after = install_state(services["browse"])
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"{name(page)} changed what it did not make (before, after): {changed}"
    DOCS_BLOCKS[name(page)] = (len(run), len(skipped))
    print(f"{name(page)}: {len(run)} block(s) run, {len(skipped)} skipped")

