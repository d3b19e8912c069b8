"""mailq trace: the story of a mail, from GetMailHistory (EventService, browse_svc).

    mailq trace ID [--queue Q] [--json]       one mail (a full enqueue id, or a unique prefix of a live mail's)
    mailq trace --name N [--json]             every mail with that name (the newest 100)

One line per event, oldest first: time (UTC), type, queue, attempt, actor, reason and details.
A mail older than the history retention (MAILQUEUE_HISTORY_RETENTION_S, 7 days) has no story left.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from mailq import ids
from mailq.common import Client, UsageError, print_table
from mailqueue.v1 import browse_pb2, events_pb2, mail_pb2


def _live_mails(c: Client, queue: str | None) -> Iterator[mail_pb2.QueuedMail]:
    """The mails a prefix may name: the queue's live mails, or every queue's."""
    queues = [queue] if queue else list(c.browse.ListQueues(browse_pb2.ListQueuesRequest()).queues)
    for q in queues:
        for r in c.browse.Browse(browse_pb2.BrowseRequest(queue=q)):
            yield r.mail


def _actor(a: events_pb2.Actor) -> str:
    if a.kind == events_pb2.ACTOR_KIND_COMPONENT:
        return f"component:{a.identity}"
    return f"{a.role}:{a.identity}" if a.role else a.identity


def _type(t: int) -> str:
    return events_pb2.EventType.Name(t).removeprefix("EVENT_TYPE_").lower()  # type: ignore[arg-type]


def _row(e: events_pb2.Event) -> dict[str, Any]:
    return {"time": e.time.ToDatetime().isoformat(timespec="milliseconds") + "Z", "type": _type(e.type), "queue": e.queue,
            "enqueue_id": e.enqueue_id, "name": e.name, "attempt": e.attempt, "actor": _actor(e.actor), "reason": e.reason,
            "details": dict(e.details), "replica": e.replica, "id": e.id}


def cmd_trace(c: Client, a: argparse.Namespace) -> None:
    if bool(a.id) == bool(a.name):
        raise UsageError("mailq trace: give an enqueue id or --name (one of them)")
    if a.id:
        (full,) = ids.resolve([a.id], lambda: _live_mails(c, a.queue), f"queue {a.queue}" if a.queue else "any queue",
                              "a prefix names live mails only: for a delivered or removed mail give its full id, or --name")
        request = events_pb2.GetMailHistoryRequest(enqueue_id=full)
    else:
        request = events_pb2.GetMailHistoryRequest(name=a.name)
    events = c.events.GetMailHistory(request).events
    rows = [_row(e) for e in events]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    if not rows:
        print("no events recorded (never enqueued, or older than the history retention)")
        return
    several = len({r["enqueue_id"] for r in rows}) > 1
    table = []
    for r in rows:
        detail = " ".join(f"{k}={v}" for k, v in sorted(r["details"].items()))
        table.append([r["time"].replace("T", " "), *([r["enqueue_id"][:8]] if several else []), r["type"], r["queue"],
                      str(r["attempt"]), r["actor"], " ".join(x for x in (r["reason"], detail) if x)])
    print_table(table, ["TIME (UTC)", *(["MAIL"] if several else []), "EVENT", "QUEUE", "ATTEMPT", "ACTOR", "REASON"])


def register(sub: Any) -> None:
    t = sub.add_parser("trace", help="what happened to a mail: its events with times and actors (by id or --name)")
    t.add_argument("id", nargs="?", help="enqueue id, or a unique prefix of a live mail's")
    t.add_argument("--name", help="every mail with this name (the newest 100)")
    t.add_argument("--queue", help="resolve an id prefix among this queue's live mails (default: every queue's)")
    t.add_argument("--json", action="store_true", help="one JSON object per event")
    t.set_defaults(fn=cmd_trace)
