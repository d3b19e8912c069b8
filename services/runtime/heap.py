"""The garbage collector of a long-running service, set once its start-up is done.

What start-up allocates lives as long as the process: modules, protobuf descriptors, the metrics
registry, the Cassandra driver's schema metadata (a keyspace's tables, columns and types, tens of
thousands of objects). With CPython's defaults each full collection walks all of it again, and
the young generation is collected every 700 allocations: in a batched dequeue at about 1,300
mails a second, the collector took 7 % of dequeue_svc's CPU and 9 % of enqueue_svc's, most of it
in full collections (docs/pages/benchmarks.md, "The collector").

``settle()`` runs once, when the backends are first connected: one collection, then
``gc.freeze()`` moves every object left into the permanent generation, which no collection walks;
and the young generation is collected every ``YOUNG`` allocations. Reference counting frees most
objects as before; only reference cycles wait longer for their collection (a full one about
every ``YOUNG`` x 20 x 100 allocations, a few minutes at that rate). A frozen object that later
becomes part of cyclic garbage (the driver's metadata of a table whose schema changed) is never
collected: the cost is bounded by what start-up made, once, since nothing made later is frozen.
``MAILQUEUE_GC_TUNED=false`` leaves CPython's defaults.

``count_pauses()`` counts the collector's time by generation,
``mailqueue_gc_pause_seconds_total{generation}``: each collection stops the event loop for its
length, so its rate is the share of a core the collector takes (bench/gc_bench.py compares both).
"""

from __future__ import annotations

import gc
import time

from prometheus_client import Counter

#: Allocations (less deallocations) between collections of the young generation (CPython: 700).
YOUNG = 10_000
#: Young collections per middle one, middle ones per full one (CPython: 10, 10).
MIDDLE, OLD = 20, 100

_settled = False
PAUSES = Counter("mailqueue_gc_pause_seconds_total", "Time the garbage collector ran, by generation", ["generation"])
_started: list[float] = []


def settle() -> bool:
    """Freeze what start-up made and space the collections out; once per process (True the first time)."""
    global _settled
    if _settled:
        return False
    _settled = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
    return True


def count_pauses() -> None:
    """Count each collection's time in PAUSES (once per process; a callback costs about a
    microsecond a collection)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        PAUSES.labels(str(info["generation"])).inc(time.perf_counter() - _started[0])
        _started.clear()
