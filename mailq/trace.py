"""mailq trace: the story of a mail, from GetMailHistory; mailq events: the event stream as it
happens, from WatchEvents (EventService, browse_svc).

    mailq trace ID [--queue Q] [--json]       one mail (a full enqueue id, or a unique prefix of a live mail's)
    mailq trace --name N [--json]             every mail with that name (the newest 100)
    mailq events [--cursor C | --oldest] [--queue Q ...] [--type T ...] [--count N] [--for S] [--json]

trace: one line per event, oldest first: time (UTC), type, queue, attempt, actor, reason and
details. A mail older than the history retention (MAILQUEUE_HISTORY_RETENTION_S, 7 days) has no
story left.

events: one line per event as it is recorded, every queue's or those named, until Ctrl-C, --count
events or --for seconds; from now on, from the oldest kept (--oldest), or from a cursor (--cursor:
that event first). When it ends it prints on stderr the command that resumes after the last event
shown, with the same filters, so nothing is missed between two runs (the events are kept for the
stream retention, MAILQUEUE_EVENT_STREAM_RETENTION_S); a run given that cursor starts after its
event. A stream the server cuts (every connection ends after MAILQUEUE_MAX_CONNECTION_AGE_S, and a
browse_svc that stops ends its streams) is resumed from the last event shown, waiting for the
service to answer again; 5 cuts in a row without an event between them end the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc

from mailq import ids
from mailq.common import Client, UsageError, enum_text, print_table, queue_option, real, shown, whole
from mailqueue.v1 import browse_pb2, events_pb2, mail_pb2
from services.domain import event_stream
from services.domain.events import HISTORY_ONLY


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
    return enum_text(events_pb2.EventType, t, "EVENT_TYPE_")


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


#: The event types as mailq names them: the proto's names without EVENT_TYPE_, lower case.
TYPES = {_type(v): v for v in events_pb2.EventType.values() if v != events_pb2.EVENT_TYPE_UNSPECIFIED}
#: Those the event stream carries (the others are in the mail history only: mailq trace).
STREAMED = {name: v for name, v in TYPES.items() if name not in {t.value for t in HISTORY_ONLY}}


#: A stream cut (the server's connection age, a browse_svc restarted) is resumed from the last
#: cursor, waiting for the service to answer again; this many cuts in a row without an event
#: between them end the command.
RESUMES = 5
RESUME_PAUSE_S = (0.2, 0.5, 1.0, 2.0, 4.0)
#: How long a resume waits for browse_svc to answer again (a restart, a rolling update) before it
#: counts as one more cut.
RESUME_WAIT_S = 30.0
#: A first call refused sooner than this never reached browse_svc: the usual error, not a cut.
REFUSED_AT_ONCE_S = 2.0
#: A watch that lasted this long before its cut was served (browse_svc ends each watch after
#: MAILQUEUE_MAX_CONNECTION_AGE_S, so that watchers spread over the replicas): the cuts in a row
#: start again from 0, or a quiet stream would end the command after RESUMES of those.
SERVED_S = 60.0



def _line(e: events_pb2.Event) -> str:
    row = _row(e)
    detail = " ".join(f"{k}={v}" for k, v in sorted(row["details"].items()))
    return shown(" ".join(x for x in (row["time"].replace("T", " "), f"{row['type']:<15}", row["queue"] or "-",
                                      row["enqueue_id"][:8] or "-", str(row["attempt"]), row["actor"], row["reason"], detail) if x))


def _again(a: argparse.Namespace, cursor: str) -> str:
    """The command that goes on after ``cursor``, with the same filters."""
    return " ".join(["mailq events --cursor", cursor, *(f"--queue {shlex.quote(q)}" for q in a.queue), *(f"--type {t}" for t in a.type),
                     *(["--json"] if a.json else [])])


def cmd_events(c: Client, a: argparse.Namespace) -> None:
    unknown = [t for t in a.type if t not in TYPES]
    if unknown:
        raise UsageError(f"mailq events: unknown event type {', '.join(unknown)}; one of: {' '.join(sorted(STREAMED))}")
    unstreamed = [t for t in a.type if t not in STREAMED]
    if unstreamed:
        raise UsageError(f"mailq events: {', '.join(unstreamed)} events are in the mail history only, never on the "
                         "event stream: see them with mailq trace")
    deadline = time.monotonic() + a.seconds if a.seconds is not None else None
    # A cursor's own event comes first again: already shown (by the run that printed the cursor).
    last, count_shown, cuts = a.cursor or "", 0, 0
    try:
        while True:
            request = events_pb2.WatchEventsRequest(cursor=last, from_oldest=a.oldest and not last, queues=a.queue,
                                                    types=[TYPES[t] for t in a.type])
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            if cuts:  # a resume waits, a bounded time, for browse_svc to answer again (a restart, a rolling update)
                wait = RESUME_WAIT_S if left is None else min(left, RESUME_WAIT_S)
                try:
                    grpc.channel_ready_future(c.browse_channel).result(timeout=wait)
                except grpc.FutureTimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise SystemExit(f"mailq events: browse_svc did not answer again before --for ran out; "
                                         f"to go on: {_again(a, last) if last else 'run it again'}") from None
                    if cuts >= RESUMES:
                        raise SystemExit(f"mailq events: browse_svc did not answer again ({RESUMES} tries of "
                                         f"{RESUME_WAIT_S:g} s): is it running?") from None
                    cuts += 1
                    continue
                left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            started = time.monotonic()
            stream = c.events.WatchEvents(request, timeout=left)
            try:
                for response in stream:
                    e = response.event
                    if e.cursor == last:
                        continue
                    print(json.dumps({**_row(e), "cursor": e.cursor}) if a.json else _line(e), flush=True)
                    last, count_shown, cuts = e.cursor, count_shown + 1, 0
                    if a.count and count_shown >= a.count:
                        return
                return  # the server ended the stream (it is stopping): a rerun goes on from the last cursor
            except grpc.RpcError as e:
                if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:  # --for ran out: the end asked for
                    return
                if e.code() is grpc.StatusCode.OUT_OF_RANGE and last:  # a stream declared again: the cursor means nothing
                    gone, last = last, a.cursor
                    raise SystemExit(f"mailq events: cursor {gone} is past the end of the event stream: the stream was "
                                     "deleted and declared again (a broker reset) since it was given; the events it "
                                     "holds: mailq events --oldest") from None
                # The server ends each watch after MAILQUEUE_MAX_CONNECTION_AGE_S, and a restarted
                # browse_svc ends its streams: go on from the last event shown.
                planned = event_stream.REBALANCED in (e.details() or "")
                if planned or time.monotonic() - started >= SERVED_S:
                    cuts = 0  # a watch ended as planned (or by an older server's connection age): not a failure
                # A watch whose reader stopped (a paused pager) past its time is cancelled by the
                # server (it cannot be told UNAVAILABLE while its writes are blocked): resumed too.
                cancelled_late = e.code() is grpc.StatusCode.CANCELLED and time.monotonic() - started >= SERVED_S
                if (e.code() is not grpc.StatusCode.UNAVAILABLE and not cancelled_late) or cuts >= RESUMES:
                    raise
                if not (planned or cuts or count_shown) and time.monotonic() - started < REFUSED_AT_ONCE_S:
                    raise  # never reached browse_svc (down, a wrong address, TLS): the usual error and hint
                where = (f"after cursor {last}" if last else "from the oldest event kept" if a.oldest
                         else "from now on (no event shown yet: one recorded during the cut is not shown)")
                print(f"the stream was cut ({e.details()}); resuming {where}", file=sys.stderr, flush=True)
                time.sleep(RESUME_PAUSE_S[min(cuts, len(RESUME_PAUSE_S) - 1)])
                cuts += 1
            finally:
                stream.cancel()
    finally:
        if last and last != a.cursor:
            print(f"{count_shown} events; to go on after the last one: {_again(a, last)}", file=sys.stderr)


def register(sub: Any) -> None:
    t = sub.add_parser("trace", help="what happened to a mail: its events with times and actors (by id or --name)")
    t.add_argument("id", nargs="?", help="enqueue id, or a unique prefix of a live mail's")
    t.add_argument("--name", help="every mail with this name (the newest 100)")
    t.add_argument("--queue", type=queue_option, help="resolve an id prefix among this queue's live mails (default: every queue's)")
    t.add_argument("--json", action="store_true", help="one JSON object per event")
    t.set_defaults(fn=cmd_trace)
    w = sub.add_parser("events", help="follow the event stream: every change as it happens (until Ctrl-C, --count or --for)")
    start = w.add_mutually_exclusive_group()
    start.add_argument("--cursor", help="go on after this event (a cursor an earlier run or an event gave): nothing after it is missed")
    start.add_argument("--oldest", action="store_true", help="start at the oldest event kept (default: from now on)")
    w.add_argument("--queue", action="append", default=[], metavar="Q", help="only this queue's events (repeatable)")
    w.add_argument("--type", action="append", default=[], metavar="TYPE", help="only events of this type (repeatable): "
                   + " ".join(sorted(STREAMED)))
    w.add_argument("--count", type=whole(), default=0, metavar="N", help="stop after N events")
    w.add_argument("--for", dest="seconds", type=real(maximum=1e9, above=True), metavar="S", help="stop after S seconds")
    w.add_argument("--json", action="store_true", help="one JSON object per event, with its cursor")
    w.set_defaults(fn=cmd_events)
