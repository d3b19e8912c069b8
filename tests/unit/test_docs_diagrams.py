"""No arrow of the docs' flowcharts runs through a box it does not join (issue 48, item 5: the home
page's picture had arrows through the service boxes, and a reader could not tell which service
touches which store). docs/check_diagrams.mjs lays each flowchart out with Mermaid's parser and
dagre, as the site does; it needs node and docs/node_modules (`make docs` installs them)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "docs" / "check_diagrams.mjs"
PAGES = sorted(str(p) for p in (ROOT / "docs" / "pages").rglob("*.md") if "```mermaid" in p.read_text())

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (ROOT / "docs" / "node_modules" / "mermaid").is_dir(),
    reason="needs node and docs/node_modules (make docs installs them)",
)

#: The home page's picture before it was drawn by layers: three arrows ran through a service box.
CROSSING = """# before

```mermaid
flowchart TB
    subgraph clients
        P[producers]
        C[consumers]
        O[operators: mailq]
        X[blob clients]
    end
    subgraph services
        E[enqueue_svc :50051]
        D[dequeue_svc :50052]
        B[browse_svc :50053]
        BL[blob_svc :50054]
        SW[retention sweep<br/>PySpark]
    end
    subgraph stores
        S[(MinIO / S3<br/>large blobs)]
        CA[(Cassandra<br/>view, small blobs)]
        R[(RabbitMQ<br/>work queues, delay ladder)]
    end
    P -->|Enqueue| E
    C <-->|Dequeue stream| D
    O -->|Browse / Admin| B
    X -->|Put / Get| BL
    E --> S & CA & R
    D --> S & CA & R
    B --> CA & R
    BL --> S & CA
    SW --> S & CA
```
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, subprocess.CompletedProcess[str]]:
    """One run (node loads Mermaid once, about 1.5 s of CPU) over every page and the old picture."""
    before = tmp_path_factory.mktemp("diagrams") / "before.md"
    before.write_text(CROSSING)
    result = subprocess.run(["node", str(CHECK), *PAGES, str(before)], capture_output=True, text=True, timeout=120)
    return str(before), result


def test_no_arrow_of_the_docs_flowcharts_crosses_a_box(report: tuple[str, subprocess.CompletedProcess[str]]) -> None:
    before, result = report
    assert any(p.endswith("index.md") for p in PAGES)
    assert result.stderr == ""
    on_pages = [line for line in result.stdout.splitlines() if "runs through" in line and not line.startswith(before)]
    assert on_pages == []


def test_the_check_finds_the_arrows_through_a_box(report: tuple[str, subprocess.CompletedProcess[str]]) -> None:
    before, result = report
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{before}:3: E -> S runs through D" in result.stdout
