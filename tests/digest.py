"""A short account of the session at the very end of pytest's output, where CI's tail shows it.

A CI log may be cut to its last lines: the FAILURES section above the summary can be out of view,
and a session stopped by its time limit shows no traceback at all. So the last lines say, for each
failed or erroring test, where it stopped (the last lines of its traceback) and what the machine
looked like then (load, free disk, free memory), and how long each tier took."""

from __future__ import annotations

import os
import shutil
from collections import defaultdict

import pytest

#: Tests described in full; more are only counted (the short summary still names them).
MAX_TESTS = 12
#: Lines of each traceback kept: the assertion or exception and the frames just above it.
TAIL_LINES = 8
#: Tier markers, in the order the suite runs them; a test with none of them is "unit".
TIERS = ("integration", "outage", "kubernetes", "cluster")

_failed: list[tuple[str, str, float, str, str]] = []
_tier_s: dict[str, float] = defaultdict(float)


def machine() -> str:
    """Load average, free disk where the tests run, available memory: the state a failure met."""
    one, five, _ = os.getloadavg()
    disk = shutil.disk_usage(os.getcwd()).free / 2**30
    mem = "?"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    mem = f"{int(line.split()[1]) / 2**20:.1f}"
    except OSError:
        pass
    return f"load {one:.1f}/{five:.1f}, disk {disk:.1f} GiB free, memory {mem} GiB available"


def tier(item: pytest.Item) -> str:
    names = [t for t in TIERS if item.get_closest_marker(t) is not None]
    return names[-1] if names else "unit"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    _tier_s[tier(item)] += report.duration
    if report.failed:
        lines = [line for line in (report.longreprtext or "").splitlines() if line.strip()]
        tail = "\n".join(f"    {line[:220]}" for line in lines[-TAIL_LINES:])
        _failed.append((report.nodeid, report.when, report.duration, machine(), tail))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write = terminalreporter.write_line
    if _tier_s:
        write("time by tier: " + ", ".join(f"{name} {s:.0f} s" for name, s in _tier_s.items()))
    if not _failed:
        return
    terminalreporter.section("where each failure stopped", sep="-")
    for nodeid, when, duration, state, tail in _failed[:MAX_TESTS]:
        write(f"{nodeid} ({when}, {duration:.1f} s; {state})")
        write(tail)
    if len(_failed) > MAX_TESTS:
        write(f"... and {len(_failed) - MAX_TESTS} more (the short summary names them)")
