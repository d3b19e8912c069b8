"""mailq dead: a queue's dead letters (BrowseService's BrowseDeadLetters and CountDeadLetters,
AdminService's RedriveDeadLetters and PurgeDeadLetters).

    mailq dead list Q [--reason expired ...] [--sender S] [--recipient R] [--name N] [--limit N] [--json]
                      [--page-size N] [--page-token T]
    mailq dead count Q [--exact]
    mailq dead redrive Q [--to T] [--rate 100] [--keep-attempts] [--limit N] [filters]
    mailq dead purge Q (--older-than 7d | filters | --all)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mailq.common import UsageError, as_json, duration, duration_arg, enum_text, follow, print_table, queue_option, selector, whole
from mailqueue.v1 import admin_pb2, browse_pb2

REASONS = ("expired", "rejected", "bounced", "delivery_limit", "content_missing", "other")


def _reason_pb(name: str) -> int:
    return browse_pb2.DeadLetterReason.Value("DEAD_LETTER_REASON_" + name.upper())


def _reason_name(value: int) -> str:
    return enum_text(browse_pb2.DeadLetterReason, value, "DEAD_LETTER_REASON_")


def _filter(a: argparse.Namespace) -> browse_pb2.DeadLetterFilter:
    return browse_pb2.DeadLetterFilter(sender=a.sender or "", recipient=a.recipient or "", name=a.name or "",
                                       reasons=[_reason_pb(r) for r in a.reason or ()])


def cmd_list(c: Any, a: argparse.Namespace) -> None:
    request = browse_pb2.BrowseDeadLettersRequest(queue=a.queue, filter=_filter(a), limit=a.limit, page_size=a.page_size,
                                                  page_token=a.page_token or "")
    rows = []
    token = ""
    for r in c.browse.BrowseDeadLetters(request):
        token = r.next_page_token  # set on the last dead letter of a page that more follow
        if a.json:
            # One JSON object per dead letter, field names as in the proto (as mailq browse --json);
            # the last one carries "next_page_token" when a next page exists.
            print(json.dumps(as_json(r), sort_keys=True))
            continue
        m = r.mail
        rows.append([m.enqueue_id, r.dead_lettered_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"), _reason_name(r.reason),
                     str(m.attempts), m.mail.sender or "<>", ",".join(m.mail.recipients), r.reason_text[:80]])
    if not a.json:
        print_table(rows, ["ENQUEUE_ID", "DEAD_LETTERED", "REASON", "ATTEMPTS", "SENDER", "RECIPIENTS", "WHY"])
        if token:
            print(f"-- next page: --page-token {token}", file=sys.stderr)


def cmd_count(c: Any, a: argparse.Namespace) -> None:
    r = c.browse.CountDeadLetters(browse_pb2.CountDeadLettersRequest(queue=a.queue, exact=a.exact))
    print_table([[_reason_name(n.reason), str(n.count)] for n in r.counts] + [["total", str(r.total)]], ["REASON", "COUNT"])


def cmd_redrive(c: Any, a: argparse.Namespace) -> None:
    request = admin_pb2.RedriveDeadLettersRequest(queue=a.queue, filter=_filter(a), to_queue=a.to or "", per_second=a.rate,
                                                  keep_attempts=a.keep_attempts, limit=a.limit)
    last = follow(c.admin.RedriveDeadLetters(request), lambda r: f"redriving: {r.scanned} scanned, {r.redriven} redriven",
                  "mailq dead redrive: interrupted: run it again (it completes the redrives begun first)")
    resumed = f" (and {last.resumed} interrupted redrive(s) completed)" if last.resumed else ""
    print(f"{last.redriven} mail(s) redriven to {a.to or a.queue}{resumed}")


def cmd_purge(c: Any, a: argparse.Namespace) -> None:
    if not (a.sender or a.recipient or a.name or a.reason or a.older_than is not None or a.all):
        raise UsageError("mailq dead purge: give a condition (--sender, --recipient, --name, --reason, --older-than) "
                         "or --all")
    request = admin_pb2.PurgeDeadLettersRequest(queue=a.queue, filter=_filter(a), all=a.all)
    if a.older_than is not None:
        request.older_than.CopyFrom(duration(a.older_than))
    last = follow(c.admin.PurgeDeadLetters(request), lambda r: f"purging: {r.scanned} scanned, {r.purged} purged",
                  "mailq dead purge: interrupted: run it again")
    print(f"{last.purged} dead letter(s) purged")


def register(sub: Any) -> None:
    d = sub.add_parser("dead", help="a queue's dead letters: list, count, redrive, purge").add_subparsers(
        dest="action", required=True)
    for action, fn, help_ in (("list", cmd_list, "list dead letters, by condition"),
                              ("count", cmd_count, "dead letters by reason"),
                              ("redrive", cmd_redrive, "send dead letters back to a queue, at most N a second"),
                              ("purge", cmd_purge, "forget dead letters by condition or age (--all: every one)")):
        s = d.add_parser(action, help=help_)
        s.add_argument("queue")
        s.set_defaults(fn=fn)
        if action == "count":
            s.add_argument("--exact", action="store_true", help="read every dead letter instead of the counters")
            continue
        s.add_argument("--reason", action="append", choices=REASONS, help="only this reason (repeat for several)")
        s.add_argument("--sender", type=selector)
        s.add_argument("--recipient", type=selector)
        s.add_argument("--name", type=selector)
        if action == "list":
            s.add_argument("--limit", type=whole(), default=0)
            s.add_argument("--json", action="store_true", help="machine-readable output")
            s.add_argument("--page-size", type=whole(), default=0, help="a page of at most N dead letters (1 to 1000)")
            s.add_argument("--page-token", help="the page after the one that printed this token (same queue and filter)")
        if action == "redrive":
            s.add_argument("--to", type=queue_option, help="another existing queue (default: back to the queue)")
            s.add_argument("--rate", type=whole(), default=0, help="mails per second at most (default 100)")
            s.add_argument("--keep-attempts", action="store_true",
                           help="keep attempts, last error and enqueue time (default: start over)")
            s.add_argument("--limit", type=whole(), default=0, help="at most this many mails")
        if action == "purge":
            s.add_argument("--older-than", type=duration_arg, help="only those dead-lettered longer ago than this")
            s.add_argument("--all", action="store_true", help="every dead letter of the queue (no condition given)")
