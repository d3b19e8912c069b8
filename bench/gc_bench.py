"""What the collector costs: the batched enqueue and dequeue with MAILQUEUE_GC_TUNED on and off, in one run.

    .venv/bin/python -m bench.gc_bench [--rounds 2] [--seconds 15] [--warmup 3] [--events true]

Each round runs both settings (which one first alternating), as bench/events_bench.py runs its
modes: services started with MAILQUEUE_GC_TUNED=true (start-up's objects frozen, young
collections every 10,000 allocations: services/runtime/heap.py) or false (CPython's defaults),
an EnqueueBatches phase then a batched Dequeue of those mails, on one keyspace warmed by a round
left out. Printed per phase: the rate, each process's CPU per mail, and the collector's ms per
mail in the phase's service (``mailqueue_gc_pause_seconds_total``); then the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.common import new_keyspace, report, run
from bench.events_bench import phase, phase_arguments

SETTINGS = ("false", "true")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    phase_arguments(p, seconds=15)
    p.add_argument("--events", default="true", help="MAILQUEUE_EVENTS of both settings' services")
    a = p.parse_args()
    keyspace = new_keyspace()
    phase(a, keyspace, a.events, -1, {"MAILQUEUE_GC_TUNED": "true"})  # the new keyspace's first flushes, in no figure
    results = []
    for i in range(a.rounds):
        order = SETTINGS if i % 2 == 0 else SETTINGS[::-1]
        results.append({tuned: phase(a, keyspace, a.events, i, {"MAILQUEUE_GC_TUNED": tuned}) for tuned in order})
    print(f"\nMAILQUEUE_GC_TUNED false / true, events={a.events}, {a.size} B mails, EnqueueBatches {a.batch} x "
          f"{a.concurrency} for {a.seconds:.0f} s, then Dequeue max_batch {a.batch}; keyspace {keyspace}")
    for i, r in enumerate(results, 1):
        for tuned, (e, d) in r.items():
            print(f"round {i} tuned={tuned}: {report('enqueue', e)}; collector {e['gc_ms']:.3f} ms per mail in enqueue_svc\n"
                  f"           {e['cpu']}\n           dequeue {d['per_s']:.1f}/s; collector {d['gc_ms']:.3f} ms per mail "
                  f"in dequeue_svc\n           {d['cpu']}")
    for path, k in (("enqueue", 0), ("dequeue", 1)):
        ratios = [r["true"][k]["per_s"] / r["false"][k]["per_s"] for r in results]
        gc = {t: statistics.median(r[t][k]["gc_ms"] for r in results) for t in SETTINGS}
        print(f"{path}: rate tuned/default, median {statistics.median(ratios):.2f} (each {', '.join(f'{x:.2f}' for x in ratios)}); "
              f"collector ms per mail, median: default {gc['false']:.3f}, tuned {gc['true']:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    run(main)
