"""The layers of services/ and the imports between them, read from the code with ``ast``.

    python -m tests.layers          the layers, each module's imports of services/, the circles
                                    and the imports that run up; exit 1 if there is any
    make lint                       runs it, and lint-imports (import-linter): the same layers and
                                    the imports a layer must not make (pyproject.toml's contracts)

Layers, bottom first; a module may import its own layer and the ones below, never one above:

    domain     rules and values: no I/O (model, errors, slices, schedule, rules, counts, settings...)
    contract   protobuf <-> domain (serde) and the broker message format
    ports      the interfaces the use-cases need: broker, blob store
    adapters   Cassandra, RabbitMQ, S3 and the blob_svc client behind those interfaces
    app        the use-cases: enqueue, dequeue, browse, admin, rules, gauges...
    runtime    wiring and serving: settings from the environment, server, interceptors, auth, logs,
               the backends a service holds
    servicers  enqueue_svc, dequeue_svc, browse_svc, blob_svc, mailq, spark: protobuf <-> use-case

Every import is counted, also one inside a function or under ``TYPE_CHECKING``: a circle that
only type hints close is still a circle for a reader.
"""

from __future__ import annotations

import ast
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ["domain", "contract", "ports", "adapters", "app", "runtime"]
SERVICERS = ["enqueue_svc", "dequeue_svc", "browse_svc", "blob_svc", "webhook_svc", "mailq", "spark"]
#: The package itself (its __init__ defines nothing).
APART = {"services"}


def modules() -> dict[str, str]:
    """Dotted module name -> path, for services/ and the servicer packages."""
    found = {}
    for top in ["services", *SERVICERS]:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "services":
        return len(LAYERS)
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The modules of ``known`` that the file imports (``from a import b``: a.b if it is a module)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else node.module)
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in sorted(known.items())}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a layer to a higher one (and any module of services/ outside the layers)."""
    bad = []
    for m, targets in g.items():
        if m in APART:
            continue
        for t in targets:
            if t in APART:
                continue
            if layer(m) == -1 or layer(t) == -1 or layer(t) > layer(m):
                bad.append((m, t))
    return sorted(bad)


def report() -> int:
    g = graph()
    by_layer = collections.defaultdict(list)
    for m in g:
        if m not in APART:
            by_layer[layer(m)].append(m)
    for i, name in enumerate([*LAYERS, "servicers"]):
        mods = by_layer.get(i, [])
        print(f"{name:10} {len(mods):3} modules")
    outside = by_layer.get(-1, [])
    if outside:
        print(f"outside the layers: {', '.join(outside)}")
    found_circles, found_up = circles(g), upward(g)
    print(f"circles: {len(found_circles)}")
    for c in found_circles:
        print("  " + " -> ".join(c))
    print(f"imports that run up: {len(found_up)}")
    for m, t in found_up:
        print(f"  {m} -> {t}")
    reach = sorted((m, t) for m, ts in g.items() if layer(m) == LAYERS.index("app") for t in ts
                   if layer(t) == LAYERS.index("adapters"))
    print(f"use-cases that reach an adapter: {len(reach)}")
    for m, t in reach:
        print(f"  {m} -> {t}")
    return 1 if found_circles or found_up or outside else 0


if __name__ == "__main__":
    sys.exit(report())
