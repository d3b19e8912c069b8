"""`make test-lanes`: every tier, in two lanes at once where they share nothing, then alone the
tiers that stop a shared backend. Not yet the test command (`make test` runs `python -m pytest`):
on 2 cores the lanes are CPU-bound (docs/pages/development/testing.md has a run's figures).

    python -m tests.lanes            # what make test-lanes runs (after up, lint, docs, contract, ...)
    python -m tests.lanes --plan     # print the steps, run nothing
    python -m tests.lanes --without-alone   # the two lanes only (the backends stay up throughout)

Most of a run is waiting (nodes restarting, Spark starting, autoscalers deciding), and the two
lanes wait on different things:

- **main** (this terminal): unit, contract and integration tests on the single-node stack, but
  the ones that stop a backend and the Spark sweep's;
- **side** (its log in ``.stack/logs/test-side.log``, printed when it ends): the cluster tier on
  its own 3-node clusters (which it starts and then stops, so their JVMs do not weigh on what
  follows), the Spark sweep's tests (their own keyspace and bucket), then the images and the
  single-node Kubernetes (``make image kube-up``);
- **alone**, once both lanes ended: the tests that stop a backend (marker ``outage``), then the
  Kubernetes tier, which stops the broker and measures the autoscaler.

Every step runs even when one before it failed (a run says all it can); the exit status is the
first failure's. ``python -m pytest`` alone still runs every test in one process, outages last.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest"]
SWEEP_TESTS = "tests/integration/test_sweep.py"


@dataclasses.dataclass
class Step:
    name: str
    argv: list[str]
    seconds: float = 0.0
    returncode: int | None = None
    summary: str = ""


def plan() -> dict[str, list[Step]]:
    """The lanes' steps, in order: ``main`` and ``side`` at once, then ``alone``."""
    quiet = ["-p", "no:cacheprovider"]  # two pytest processes at once: neither writes .pytest_cache
    return {
        "main": [Step("unit, contract, integration", [*PYTEST, *quiet, "-m", "not cluster and not kubernetes and not outage",
                                                      f"--ignore={SWEEP_TESTS}"])],
        "side": [
            Step("cluster tier", [*PYTEST, *quiet, "-m", "cluster"]),
            Step("clusters stopped", [str(ROOT / "stack" / "stack.sh"), "down", "--cluster"]),
            Step("Spark sweep", [*PYTEST, *quiet, "-m", "not outage", SWEEP_TESTS]),
            Step("images, Kubernetes up", ["make", "--no-print-directory", "image", "kube-up"]),
        ],
        "alone": [
            Step("outages", [*PYTEST, *quiet, "-m", "outage"]),
            Step("Kubernetes tier", [*PYTEST, *quiet, "-m", "kubernetes"]),
        ],
    }


SUMMARY = re.compile(r"^=+ (.*\d+ (?:passed|failed|error|errors|skipped|deselected).*) =+$")


def run(step: Step, out) -> None:
    """Run one step, its output to ``out``; keep its time, status and pytest's last line."""
    print(f"\n##### {step.name}: {' '.join(step.argv)}", file=out, flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(step.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in proc.stdout:
        out.write(line)
        out.flush()
        match = SUMMARY.match(line.strip())
        if match:
            step.summary = match.group(1)
    step.returncode = proc.wait()
    step.seconds = time.monotonic() - started
    print(f"##### {step.name}: exit {step.returncode} after {step.seconds:.0f} s", file=out, flush=True)


def run_lane(steps: list[Step], out) -> None:
    for step in steps:
        run(step, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="every test tier, in lanes (make test-lanes)")
    parser.add_argument("--plan", action="store_true", help="print the steps and run nothing")
    parser.add_argument("--without-alone", action="store_true",
                        help="run the two lanes only, not the outage and Kubernetes tiers after them")
    args = parser.parse_args(argv)
    lanes = plan()
    if args.without_alone:
        lanes["alone"] = []
    if args.plan:
        for lane, steps in lanes.items():
            for step in steps:
                print(f"{lane:6} {step.name:28} {' '.join(step.argv)}")
        return 0
    started = time.monotonic()
    log_dir = pathlib.Path(os.environ.get("MAILQUEUE_STACK_DIR", ROOT / ".stack")) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    side_log = log_dir / "test-side.log"
    with open(side_log, "w", encoding="utf-8") as side_out:
        print(f"[lanes] side lane started: {', '.join(s.name for s in lanes['side'])}; its log: {side_log}", flush=True)
        side = threading.Thread(target=run_lane, args=(lanes["side"], side_out))
        side.start()
        run_lane(lanes["main"], sys.stdout)
        if side.is_alive():
            print(f"\n[lanes] main lane done after {time.monotonic() - started:.0f} s; waiting for the side lane", flush=True)
        side.join()
    print(f"\n[lanes] ===== the side lane's log ({side_log}) =====", flush=True)
    sys.stdout.write(side_log.read_text(encoding="utf-8"))
    run_lane(lanes["alone"], sys.stdout)
    steps = [s for lane in lanes.values() for s in lane]
    print(f"\n[lanes] ===== every step ({time.monotonic() - started:.0f} s in all) =====")
    for lane, lane_steps in lanes.items():
        for s in lane_steps:
            print(f"  {lane:6} {s.name:28} exit {s.returncode}  {s.seconds:6.0f} s  {s.summary}")
    failed = [s for s in steps if s.returncode]
    return failed[0].returncode if failed else 0


if __name__ == "__main__":
    sys.exit(main())
