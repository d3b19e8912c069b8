"""mailq's commands on the mails of a queue: browse, delete, clear, flush, republish, move.

    mailq browse Q [--sender S] [--recipient R] [--name N] [--id ID] [--ready | --delayed] [--limit N] [--json]
                   [--page-size N] [--page-token T]
    mailq delete Q (--sender S | --recipient R | --name N | --id ID [ID ...]) | clear Q --force
    mailq flush Q [--sender S | --recipient R | --domain D | --name N]
    mailq republish Q --older-than 1h
    mailq move Q TO [--sender S] [--recipient R] [--name N] [--id ID [ID ...]] [--ready | --delayed] [--limit N]

An ID is a full enqueue id or a unique prefix of one (at least 4 characters: mailq/ids.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from mailq import ids
from mailq.common import Client, UsageError, as_json, duration, duration_arg, follow, print_table, queue_command, selector, whole
from mailqueue.v1 import admin_pb2, browse_pb2, mail_pb2


def mail_row(m: mail_pb2.QueuedMail) -> dict[str, Any]:
    return as_json(m)


def progress_stream(stream: Iterator[Any], what: str) -> int:
    """A delete's or clear's progress shown; how many it deleted (a stream that ended before its
    last message: exit 1, say to run it again)."""
    last = follow((r.progress for r in stream), lambda p: f"{what}: {p.scanned} scanned, {p.deleted} deleted",
                  f"mailq: {what} interrupted before its end: run it again (what it marked stays marked)")
    return last.deleted


def cmd_browse(c: Client, a: argparse.Namespace) -> None:
    schedule = (browse_pb2.SCHEDULE_FILTER_READY if a.ready else
                browse_pb2.SCHEDULE_FILTER_DELAYED if a.delayed else browse_pb2.SCHEDULE_FILTER_UNSPECIFIED)
    request = browse_pb2.BrowseRequest(queue=a.queue, sender=a.sender or "", recipient=a.recipient or "",
                                       name=a.name or "", limit=a.limit, schedule=schedule,
                                       enqueue_id=ids.in_queue(c, a.queue, [a.id])[0] if a.id else "",
                                       page_size=a.page_size, page_token=a.page_token or "")
    rows = []
    # The next page's token comes on the last mail of a page (BrowseResponse.next_page_token).
    held, token = None, ""
    for r in c.browse.Browse(request):
        token = r.next_page_token
        if a.json:
            if held is not None:
                print(json.dumps(held))
            held = mail_row(r.mail)
            continue
        m = r.mail
        due = m.deliver_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S") if m.HasField("deliver_at") else "-"
        rows.append([m.enqueued_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"), m.enqueue_id[:8], str(m.size),
                     m.mail.sender or "<>", ",".join(m.mail.recipients), m.mail.name, due, str(m.attempts)])
    if a.json:
        if held is not None:
            # One JSON object per mail; the last one also carries "next_page_token" when a next page exists.
            print(json.dumps({**held, "next_page_token": token} if token else held))
        return
    print_table(rows, ["ENQUEUED (UTC)", "ID", "SIZE", "SENDER", "RECIPIENTS", "NAME", "DELIVER AT", "ATTEMPTS"])
    more = f"; next page: --page-token {token}" if token else ""
    print(f"-- {len(rows)} mail(s){more}", file=sys.stderr)


def cmd_delete(c: Client, a: argparse.Namespace) -> None:
    condition: dict[str, Any] = {k: v for k, v in (("sender", a.sender), ("recipient", a.recipient), ("name", a.name),
                                                   ("enqueue_ids", a.ids)) if v is not None}
    if len(condition) != 1:
        raise UsageError("mailq delete: give exactly one of --sender, --recipient, --name, --id")
    if a.ids is not None:
        condition["enqueue_ids"] = admin_pb2.EnqueueIds(ids=ids.in_queue(c, a.queue, a.ids))
    n = progress_stream(c.admin.DeleteMails(admin_pb2.DeleteMailsRequest(queue=a.queue, **condition)), "deleting")
    print(f"{n} mail(s) deleted")


def cmd_clear(c: Client, a: argparse.Namespace) -> None:
    if not a.force:  # one word away from `mailq throttle clear` and `mailq quota clear`
        raise UsageError(f"mailq clear deletes every live mail of queue {a.queue}: add --force to do it "
                         "(mailq delete deletes by sender, recipient, name or id)")
    n = progress_stream(c.admin.ClearQueue(admin_pb2.ClearQueueRequest(queue=a.queue)), "clearing")
    print(f"{n} mail(s) deleted")


def cmd_move(c: Client, a: argparse.Namespace) -> None:
    schedule = (browse_pb2.SCHEDULE_FILTER_READY if a.ready else browse_pb2.SCHEDULE_FILTER_DELAYED if a.delayed
                else browse_pb2.SCHEDULE_FILTER_UNSPECIFIED)
    request = admin_pb2.MoveMailsRequest(queue=a.queue, to_queue=a.to_queue, sender=a.sender or "", recipient=a.recipient or "",
                                         name=a.name or "", schedule=schedule, limit=a.limit,
                                         enqueue_ids=ids.in_queue(c, a.queue, a.ids) if a.ids else [])
    last = follow(c.admin.MoveMails(request), lambda r: f"moving to {a.to_queue}: {r.scanned} scanned, {r.moved} moved",
                  "mailq move: interrupted: run it again (it completes the moves begun first)")
    resumed = f" (and {last.resumed} interrupted move(s) completed)" if last.resumed else ""
    print(f"{last.moved} mail(s) moved to {a.to_queue}{resumed}")


def cmd_flush(c: Client, a: argparse.Namespace) -> None:
    condition = {k: v for k, v in (("sender", a.sender), ("recipient", a.recipient), ("recipient_domain", a.domain),
                                   ("name", a.name)) if v is not None}
    if len(condition) > 1:
        raise UsageError("mailq flush: give at most one of --sender, --recipient, --domain, --name")
    print(f"{c.admin.Flush(admin_pb2.FlushRequest(queue=a.queue, **condition)).flushed} mail(s) flushed")


def cmd_republish(c: Client, a: argparse.Namespace) -> None:
    r = c.admin.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(queue=a.queue, older_than=duration(a.older_than)))
    print(f"{r.republished} mail(s) republished")


def _mail_command(sub: Any, name: str, fn: Any, help: str, by_id: bool = False) -> argparse.ArgumentParser:
    """A command on the mails of a queue chosen by sender, recipient or name (``by_id``: or enqueue ids)."""
    s = queue_command(sub, name, fn, help)
    s.add_argument("--sender", type=selector)
    s.add_argument("--recipient", type=selector)
    s.add_argument("--name", type=selector)
    if by_id:
        s.add_argument("--id", dest="ids", metavar="ID", nargs="+", action="extend",
                       help="the mails with these enqueue ids, each in full or a unique prefix (at least 4 characters)")
    return s


def _schedule_args(s: argparse.ArgumentParser, delayed: str) -> None:
    which = s.add_mutually_exclusive_group()
    which.add_argument("--ready", action="store_true", help="only mails deliverable now")
    which.add_argument("--delayed", action="store_true", help=delayed)


def register(sub: Any) -> None:
    s = queue_command(sub, "browse", cmd_browse, "list a queue's live mails, by condition")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--sender", type=selector)
    s.add_argument("--recipient", type=selector)
    s.add_argument("--name", type=selector)
    s.add_argument("--limit", type=whole(), default=0)
    s.add_argument("--id", metavar="ID", help="only the mail with this enqueue id (read from an index), in full or a unique prefix")
    s.add_argument("--page-size", type=whole(), default=0, help="a page of at most N mails (1 to 1000); the next "
                   "page's token is printed on stderr, or in the last JSON line's next_page_token")
    s.add_argument("--page-token", help="the page after the one that printed this token (same queue and conditions)")
    _schedule_args(s, "only mails waiting for their deliver_at")
    _mail_command(sub, "delete", cmd_delete, "mark deleted every live mail matching a condition", by_id=True)
    s = queue_command(sub, "clear", cmd_clear, "mark every live mail of the queue deleted (--force)")
    s.add_argument("--force", action="store_true", help="do it: without it, mailq clear deletes nothing")
    s = _mail_command(sub, "flush", cmd_flush, "make delayed mails deliverable now, in enqueue order (postqueue -s)")
    s.add_argument("--domain", type=selector, help="only mails with a recipient in this domain")
    s = queue_command(sub, "republish", cmd_republish, "publish again every live mail older than a duration (heals a broker that lost messages)")
    s.add_argument("--older-than", type=duration_arg, required=True)
    s = _mail_command(sub, "move", cmd_move, "move live mails to another existing queue", by_id=True)
    s.add_argument("to_queue", metavar="TO")
    s.add_argument("--limit", type=whole(), default=0, help="at most this many mails")
    _schedule_args(s, "only delayed or held mails")
