"""Where a test run's time went, by tier and by file, from the JUnit report `make test` writes.

    python -m tests.timings                       # .stack/logs/test-results.xml (make test's)
    python -m tests.timings path/to/results.xml --files 20

The tier of a file is the folder under tests/ it sits in (unit, contract, integration,
kubernetes, cluster). A test's time is its call, setup and teardown together.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = ROOT / ".stack" / "logs" / "test-results.xml"


def by_file(report: pathlib.Path) -> dict[str, tuple[float, int]]:
    """File → (seconds, tests) from a JUnit XML report of pytest's."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for case in ET.parse(report).getroot().iter("testcase"):
        classname = case.get("classname", "")
        # pytest's classname is the dotted module path (plus a class, if any): tests.unit.test_x[.Class]
        parts = classname.split(".")
        module = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), classname)
        entry = out[module.replace(".", "/") + ".py"]
        entry[0] += float(case.get("time", "0") or 0)
        entry[1] += 1
    return {f: (s, int(n)) for f, (s, n) in out.items()}


def tier(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default=str(DEFAULT))
    p.add_argument("--files", type=int, default=15, help="how many of the slowest files to list")
    a = p.parse_args(argv)
    report = pathlib.Path(a.report)
    if not report.exists():
        print(f"no report at {report}: run make test (it writes one), or give a pytest --junitxml file", file=sys.stderr)
        return 2
    files = by_file(report)
    total = sum(s for s, _ in files.values())
    if not files or total <= 0:
        print(f"{report}: no timed tests", file=sys.stderr)
        return 1
    tiers: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for f, (s, n) in files.items():
        tiers[tier(f)][0] += s
        tiers[tier(f)][1] += n
    print(f"{'tier':<14} {'minutes':>8} {'share':>6} {'tests':>6}")
    for name, (s, n) in sorted(tiers.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:<14} {s / 60:8.1f} {s / total:6.0%} {n:6d}")
    print(f"{'all':<14} {total / 60:8.1f} {'':>6} {sum(n for _, n in files.values()):6d}\n")
    print(f"{'file':<60} {'minutes':>8} {'tests':>6}")
    for f, (s, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:a.files]:
        print(f"{f:<60} {s / 60:8.1f} {n:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
