"""What earlier bench and test runs left on the local stack, and its removal.

A run that ends normally removes what it made (``bench.common.run``, the tests' fixtures). One
killed half-way, or a scratch script that does not go through them, leaves its keyspace, its
mail queues' RabbitMQ queues and its event stream behind. They cost the backends CPU while idle
(189 queues and 13 keyspaces kept RabbitMQ at 0.10 of a core and Cassandra above 0.07 on
2026-12-05) and so skew every later measurement: each bench says so when it starts.

    .venv/bin/python -m bench.leftovers            # list them
    .venv/bin/python -m bench.leftovers --drop     # remove them (refused while a bench or test runs)

Throwaway, by name: keyspaces ``mq_bench_*`` and ``mq_test_*``; RabbitMQ queues of a mail queue
named ``<anything>-<8 to 12 hex digits>`` (the benches', the tests' and the contract clients'
queues); the event stream and dead-letter-marks queue of a throwaway keyspace. A RabbitMQ queue
with a consumer is in use, so never listed; nor is a queue of a keyspace that is not throwaway
(``make run``'s ``mailqueue``, an operator's), whatever its name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys

from stack import harness
from stack.harness import ROOT

KEYSPACE_PREFIXES = ("mq_bench_", "mq_test_")
_THROWAWAY_QUEUE = re.compile(r"-[0-9a-f]{8,12}$")
_SUFFIXES = (".work.high", ".work.low", ".work", ".dead-letter")


@dataclasses.dataclass
class Leftovers:
    keyspaces: list[str]
    #: RabbitMQ queues (by their broker name) and the exchanges that go with them.
    queues: list[str]
    exchanges: list[str]

    def __bool__(self) -> bool:
        return bool(self.keyspaces or self.queues)

    def summary(self) -> str:
        return f"{len(self.keyspaces)} throwaway keyspaces and {len(self.queues)} throwaway RabbitMQ queues"


def throwaway_keyspace(name: str) -> bool:
    return name.startswith(KEYSPACE_PREFIXES)


def throwaway_broker_queue(name: str, kept: frozenset[str] = frozenset()) -> bool:
    """Whether a RabbitMQ queue belongs to a run's throwaway mail queue or keyspace (by its name).
    ``kept``: the mail queues of the keyspaces that are not throwaway (an operator's queue named
    like a run's, ``daily-2026120701``, is one of them): never theirs."""
    from services.domain import names

    prefix = names.AMQP_PREFIX + "."
    if not name.startswith(prefix):
        return False
    rest = name.removeprefix(prefix)
    for kind in ("_events.", "dead-letter-marks."):
        if rest.startswith(kind):
            return throwaway_keyspace(rest.removeprefix(kind))
    for suffix in _SUFFIXES:
        if rest.endswith(suffix):
            queue = rest.removesuffix(suffix)
            return bool(_THROWAWAY_QUEUE.search(queue)) and queue not in kept
    return False


def exchanges_of(queue: str) -> list[str]:
    """The exchanges that go with a throwaway RabbitMQ queue: the mail queue's two, or the event
    stream's own."""
    from services.domain import names

    rest = queue.removeprefix(names.AMQP_PREFIX + ".")
    if rest.startswith("_events."):
        return [queue]
    if rest.startswith("dead-letter-marks."):
        return []
    for suffix in _SUFFIXES:
        if rest.endswith(suffix):
            return harness.mail_queue_objects(rest.removesuffix(suffix))[1]
    return []


def _keyspaces() -> tuple[list[str], frozenset[str]]:
    """Every keyspace, and the mail queues of those that are not throwaway (an operator's)."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    cluster, session = connect(cassandra_from_env(os.environ))
    try:
        keyspaces = sorted(r.keyspace_name for r in session.execute("SELECT keyspace_name FROM system_schema.keyspaces"))
        kept = set()
        for k in keyspaces:
            tables = cluster.metadata.keyspaces[k].tables
            if not throwaway_keyspace(k) and schema.QUEUES in tables:
                kept.update(r.queue_name for r in session.execute(f"SELECT queue_name FROM {k}.{schema.QUEUES}"))
            if not throwaway_keyspace(k) and schema.DROPPED_QUEUES in tables:  # a deletion under way may be refused yet
                kept.update(r.queue_name for r in session.execute(f"SELECT queue_name, done_at FROM {k}.{schema.DROPPED_QUEUES}")
                            if r.done_at is None)
        return keyspaces, frozenset(kept)
    finally:
        cluster.shutdown()


def _idle_broker_queues() -> list[str]:
    """The broker's queues that have no consumer (``rabbitmqctl list_queues`` on the local node)."""
    out = subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), "rabbitmqctl", "list_queues", "name", "consumers",
                          "--formatter", "json", "-q"], capture_output=True, text=True, timeout=60, check=True).stdout
    return sorted(q["name"] for q in json.loads(out) if not q.get("consumers"))


def find() -> Leftovers:
    """The throwaway keyspaces and idle throwaway RabbitMQ queues on the local stack."""
    every, kept = _keyspaces()
    keyspaces = [k for k in every if throwaway_keyspace(k)]
    queues = [q for q in _idle_broker_queues() if throwaway_broker_queue(q, kept)]
    exchanges = sorted({e for q in queues for e in exchanges_of(q)})
    return Leftovers(keyspaces, queues, exchanges)


def warn_if_any() -> None:
    """A bench's first line when the stack holds leftovers (nothing when it cannot tell)."""
    try:
        found = find()
    except Exception as e:  # noqa: BLE001 - a check that must never stop a bench
        print(f"[bench] could not look for leftovers of earlier runs ({type(e).__name__}): measuring anyway", file=sys.stderr)
        return
    if found:
        print(f"[bench] WARNING: the stack holds {found.summary()} of earlier runs; they cost the backends CPU "
              f"while idle and skew these figures. Remove them first: .venv/bin/python -m bench.leftovers --drop",
              file=sys.stderr)


def others_running() -> list[str]:
    """Command lines of other bench or pytest processes (their keyspaces and queues are in use);
    this process and those that started it (``timeout …``, a shell) are not others."""
    found, own = [], _ancestors()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in own:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        line = " ".join(argv).strip()
        if any(a.startswith("bench.") for a in argv) or " pytest" in f" {line}" or "/pytest" in line:
            found.append(f"{pid}: {line[:120]}")
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state: the parent
        except (OSError, ValueError, IndexError):
            break
    return pids


def drop(found: Leftovers) -> None:
    import pika

    for k in found.keyspaces:
        harness.drop_keyspace(k)
        print(f"dropped keyspace {k}", file=sys.stderr)
    if found.queues:
        with pika.BlockingConnection(harness.broker_parameters()) as conn:
            ch = conn.channel()
            for q in found.queues:
                ch.queue_delete(q)
            for e in found.exchanges:
                ch.exchange_delete(e)
        print(f"deleted {len(found.queues)} RabbitMQ queues and {len(found.exchanges)} exchanges", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.leftovers", description=__doc__.split("\n\n")[0])
    p.add_argument("--drop", action="store_true", help="remove them (refused while another bench or pytest runs)")
    args = p.parse_args()
    from bench.common import use_stack

    use_stack()
    found = find()
    for k in found.keyspaces:
        print(f"keyspace  {k}")
    for q in found.queues:
        print(f"queue     {q}")
    print(f"{found.summary()}", file=sys.stderr)
    if not args.drop or not found:
        return
    running = others_running()
    if running:
        sys.exit("not dropping: these may be using them (end them first):\n  " + "\n  ".join(running))
    drop(found)


if __name__ == "__main__":
    main()
