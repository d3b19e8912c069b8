"""Requests sent to Cassandra, counted by kind: what each path costs Cassandra, read from /metrics.

A kind is the statement's verb and table, without the keyspace (``insert enqueued_mails``,
``select blobs``), with `` lwt`` for a conditional write (a Paxos round: several times the work
of a plain write). A batch is one request: ``batch`` and the kind of its first statement
(``batch insert enqueued_mails``). The counter counts requests, not rows: a group-committed
batch of 64 rows counts once (group_commit.py's histogram says how many rows each carried).

Every statement of the services goes through session.py's execute functions, which count here;
the schema steps (migrate) and the blocking bulk jobs do not.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import Counter

STATEMENTS = Counter(
    "mailqueue_cassandra_statements_total",
    "Requests this process sent to Cassandra, by kind: verb and table ('lwt': a conditional write; "
    "'batch <kind>': one batch request, counted once whatever its rows)",
    ["kind"],
)

_VERB_TABLE = re.compile(
    r"^\s*(?:(select)\b.*?\bfrom|(insert)\s+into|(update)|(delete)\b.*?\bfrom)\s+([\w\".]+)", re.I | re.S,
)
_CONDITIONAL = re.compile(r"\sIF\s+(?:NOT\s+EXISTS|EXISTS|\w+\s*(?:=|!=|<|>|IN\b))", re.I)
_KINDS: dict[str, str] = {}
_COUNTERS: dict[str, Any] = {}


def kind_of_query(query: str) -> str:
    """``verb table`` of a CQL string (``lwt`` appended for a conditional write); else its first word."""
    kind = _KINDS.get(query)
    if kind is None:
        m = _VERB_TABLE.match(query)
        if m:
            verb = next(g for g in m.groups()[:4] if g).lower()
            kind = f"{verb} {m.group(5).rsplit('.', 1)[-1].strip(chr(34)).lower()}"
            if verb != "select" and _CONDITIONAL.search(query):
                kind += " lwt"
        else:
            kind = (query.split(None, 1) or ["empty"])[0].lower()
        if len(_KINDS) > 1000:  # queries are prepared once each; a bound on a caller's mistake
            _KINDS.clear()
        _KINDS[query] = kind
    return kind


def kind_of(statement: Any) -> str:
    """The kind of a string, a prepared, bound or simple statement; ``batch`` for a batch."""
    if isinstance(statement, str):
        return kind_of_query(statement)
    prepared = getattr(statement, "prepared_statement", None)  # a BoundStatement
    query = getattr(prepared if prepared is not None else statement, "query_string", None)
    return kind_of_query(query) if isinstance(query, str) else "batch"


def batch_kind(first: Any) -> str:
    """The kind of a batch whose first statement is ``first``."""
    return f"batch {kind_of(first)}"


def count(statement: Any, kind: str | None = None) -> None:
    """One request of ``statement`` (or of ``kind``, given for a batch) sent."""
    kind = kind or kind_of(statement)
    child = _COUNTERS.get(kind)
    if child is None:
        child = _COUNTERS[kind] = STATEMENTS.labels(kind)
    child.inc()
