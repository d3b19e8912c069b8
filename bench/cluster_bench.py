"""The replication cost: batched enqueue and dequeue of 10 KiB mails on the single-node stack and
on the 3-node clusters, in the same run, each with the CPU per mail of every process.

    .venv/bin/python -m bench.cluster_bench [--seconds 20] [--mails 4000] [--size 10240] [--batch 32] [--dequeue-batch 128]

Needs both stacks up: stack/stack.sh up and stack/stack.sh up --cluster (their ports differ).
For each stack it runs bench.enqueue_bench (single Enqueue and EnqueueBatches, then the direct
path), bench.enqueue_bench --rate-only at half the single-Enqueue peak (p99 below the peak), and
bench.dequeue_bench (batched), as subprocesses with that stack's environment, and prints their
reports one after the other, then one table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from bench.common import ROOT


def cluster_env() -> dict[str, str]:
    out = subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), "cluster-env"], capture_output=True, text=True,
                         check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    env.pop("MAILQUEUE_SPARK_MASTER", None)
    return {**env, "MAILQUEUE_BENCH_STACK": "cluster"}


def bench(module: str, env: dict[str, str], *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench.{module} {' '.join(args)} failed:\n{p.stdout}\n{p.stderr[-3000:]}")
    return p.stdout


def rate(report: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s+(?:\d+ ops\s+)?([\d.]+)(?:/s| mails/s)", report, re.M)
    if m is None:
        raise SystemExit(f"no '{label}' line in:\n{report}")
    return float(m.group(1))


def p99(report: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s.*p99\s+([\d.]+) ms", report, re.M)
    return float(m.group(1)) if m else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--mails", type=int, default=4000)
    p.add_argument("--size", type=int, default=10 * 1024)
    p.add_argument("--batch", type=int, default=32, help="mails per EnqueueBatches message")
    p.add_argument("--dequeue-batch", type=int, default=128, help="Subscribe.max_batch")
    a = p.parse_args()
    single = {k: v for k, v in os.environ.items() if not k.startswith("MAILQUEUE_")}
    stacks = {"single node": single, "3-node clusters": {**single, **cluster_env()}}
    rows = []
    for name, env in stacks.items():
        print(f"\n===== {name}", flush=True)
        enq = bench("enqueue_bench", env, "--seconds", str(a.seconds), "--warmup", str(a.warmup), "--size", str(a.size),
                    "--batch", str(a.batch))
        print(enq, flush=True)
        single_peak = rate(enq, "grpc")
        paced = bench("enqueue_bench", env, "--seconds", str(a.seconds), "--warmup", str(a.warmup), "--size", str(a.size),
                      "--rate", f"{single_peak / 2:.0f}", "--rate-only")
        print(paced, flush=True)
        deq = bench("dequeue_bench", env, "--mails", str(a.mails), "--size", str(a.size), "--batch", str(a.dequeue_batch))
        print(deq, flush=True)
        rows.append((name, rate(enq, f"grpc-batch{a.batch}"), rate(enq, "direct"), rate(deq, f"batch{a.dequeue_batch}"),
                     rate(deq, "direct"), single_peak, p99(paced, f"grpc@{single_peak / 2:.0f}/s")))
    print(f"\n{a.size} B mails       enqueue batch{a.batch} | direct | dequeue batch{a.dequeue_batch} | direct | "
          "single Enqueue peak | p99 at half of it")
    for name, eb, ed, db, dd, peak, lat in rows:
        print(f"{name:<16} {eb:>10.1f}/s | {ed:>6.1f}/s | {db:>13.1f}/s | {dd:>6.1f}/s | {peak:>14.1f}/s | {lat:>8.1f} ms")
    (_, eb1, _, db1, _, _, _), (_, eb3, _, db3, _, _, _) = rows
    print(f"clusters / single node: enqueue {eb3 / eb1:.2f}, dequeue {db3 / db1:.2f}")


if __name__ == "__main__":
    main()
