"""What one Cassandra request costs the process that sends it, by the shape of a dequeue answer's writes.

    .venv/bin/python -m bench.request_cost [--answers 3000] [--marks 21] [--history-bytes 6000] [--rounds 2]

A batched Dequeue answer (an Outcomes message of about 21 SUCCESS answers) writes its mails'
deleted marks as one unlogged batch, and, with events on, its events as a history row (about
6 KB for 21 mails' HANDED_OUT and DELIVERED) in a request of its own, at the same time. This
bench sends those writes through the services' own driver path (``services.adapters.cassandra.
session.execute``, TLS as the stack serves it) from 8 concurrent loops, three ways:

- ``marks``: the marks' batch alone (events off);
- ``separate``: the marks' batch and the history row as two requests at once (what dequeue_svc does);
- ``merged``: the history row added to the marks' batch, one request.

and prints this process's CPU (all its threads) per answer and per mail for each, in alternating
rounds: how much of events' cost is the history's request itself, and what merging the two
writes would save. Needs the stack up; uses a keyspace of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

from bench.common import new_keyspace, run
from services.adapters.cassandra.session import connect, execute

SHAPES = ("marks", "separate", "merged")
LOOPS = 8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=3000, help="Outcomes messages per shape and round")
    p.add_argument("--marks", type=int, default=21, help="SUCCESS answers per Outcomes message")
    p.add_argument("--history-bytes", type=int, default=6000, help="the history row's events, bytes")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if a.answers < LOOPS:
        p.error(f"--answers must be at least {LOOPS} (one per concurrent loop)")
    from cassandra.query import BatchStatement, BatchType

    from services.runtime.settings import Settings

    cluster, session = connect(Settings.from_env("dequeue").cassandra)
    ks = new_keyspace()
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {ks}.history (k uuid, w timeuuid, events blob, PRIMARY KEY (k, w))")
    session.execute(f"CREATE TABLE {ks}.marks (q text, id uuid, reason text, at timestamp, PRIMARY KEY (q, id))")
    history = session.prepare(f"INSERT INTO {ks}.history (k, w, events) VALUES (?, now(), ?) USING TTL 600")
    mark = session.prepare(f"INSERT INTO {ks}.marks (q, id, reason, at) VALUES (?, ?, ?, toTimestamp(now()))")
    body = os.urandom(a.history_bytes)

    def marks_batch() -> Any:
        b = BatchStatement(batch_type=BatchType.UNLOGGED)
        for _ in range(a.marks):
            b.add(mark, ("q", uuid.uuid4(), "dequeued"))
        return b

    async def answer(shape: str) -> None:
        b = marks_batch()
        if shape == "marks":
            await execute(session, b)
        elif shape == "separate":
            await asyncio.gather(execute(session, b), execute(session, history.bind((uuid.uuid4(), body))))
        else:
            b.add(history, (uuid.uuid4(), body))
            await execute(session, b)

    async def loop(shape: str, n: int) -> None:
        for _ in range(n):
            await answer(shape)

    async def measure() -> dict[str, list[float]]:
        cpu: dict[str, list[float]] = {s: [] for s in SHAPES}
        for r in range(a.rounds):
            for shape in (SHAPES if r % 2 == 0 else tuple(reversed(SHAPES))):
                await loop(shape, 100)  # warm
                c0, t0 = time.process_time(), time.monotonic()
                await asyncio.gather(*(loop(shape, a.answers // LOOPS) for _ in range(LOOPS)))
                c1, t1 = time.process_time(), time.monotonic()
                n = a.answers // LOOPS * LOOPS
                cpu[shape].append((c1 - c0) / n * 1e6)
                print(f"round {r + 1} {shape:9s} {cpu[shape][-1]:7.1f} us CPU per answer, "
                      f"{cpu[shape][-1] / a.marks:5.1f} per mail, {n / (t1 - t0):7.1f} answers/s", flush=True)
        return cpu

    try:
        cpu = asyncio.run(measure())
    finally:
        cluster.shutdown()
    m = {s: statistics.median(v) for s, v in cpu.items()}
    print(f"median us CPU per answer ({a.marks} mails): marks {m['marks']:.0f}, separate {m['separate']:.0f}, merged {m['merged']:.0f}")
    print(f"the history row's request: {(m['separate'] - m['marks']) / a.marks:.1f} us per mail; "
          f"in the marks' batch instead: {(m['merged'] - m['marks']) / a.marks:.1f}; merging saves "
          f"{(m['separate'] - m['merged']) / a.marks:.1f} us per mail")


if __name__ == "__main__":
    run(main)
