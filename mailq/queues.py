"""mailq's commands on queues themselves: list, show, size, shape, create, retry policy, drop,
reconcile the counters, and the view configuration.

    mailq queues | show Q [--json] [--exact] | size Q [--exact] | shape Q [--top 20] | reconcile Q
    mailq create Q | retry-policy Q [--initial-backoff 1m] [--multiplier 2] [--max-backoff 1h] [--max-attempts 20] [--max-age 5d]
    mailq drop Q [--force]
    mailq config get | config set [--slice-window 1h] [--buckets N] [--pace N]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from mailq import throttle
from mailq.common import (
    EXIT_ERROR,
    EXIT_OK,
    Client,
    UsageError,
    as_json,
    duration,
    duration_arg,
    follow,
    positive_duration_arg,
    queue_command,
    real,
    whole,
)
from mailqueue.v1 import admin_pb2, browse_pb2
from services.domain.durations import human


def cmd_queues(c: Client, a: argparse.Namespace) -> None:
    for name in c.browse.ListQueues(browse_pb2.ListQueuesRequest()).queues:
        print(name)


def retry_policy(a: argparse.Namespace) -> browse_pb2.RetryPolicy | None:
    """The policy fields given on the command line (None when none is)."""
    p = browse_pb2.RetryPolicy(multiplier=a.multiplier or 0, max_attempts=a.max_attempts or 0)
    for field in ("initial_backoff", "max_backoff", "max_age"):
        if getattr(a, field) is not None:
            getattr(p, field).CopyFrom(duration(getattr(a, field)))
    return p if p.ListFields() else None


def print_policy(p: browse_pb2.RetryPolicy) -> None:
    print(f"retry policy     backoff {human(p.initial_backoff.ToTimedelta())} x{p.multiplier:g} up to "
          f"{human(p.max_backoff.ToTimedelta())}; expires after {p.max_attempts} attempts or {human(p.max_age.ToTimedelta())}")


def cmd_show(c: Client, a: argparse.Namespace) -> None:
    info = c.browse.GetQueue(browse_pb2.GetQueueRequest(queue=a.queue, exact=a.exact)).queue_info
    if a.json:
        print(json.dumps(as_json(info)))  # one line, as every --json
        return
    print(f"queue            {info.queue}")
    print(f"size             {info.size} ({info.ready} ready, {info.delayed} delayed, {info.held} held)"
          + ("  [from counters]" if info.approximate else ""))
    print(f"dead-lettered    {info.dead_lettered}")
    print(f"oldest mail age  {human(info.oldest_mail_age.ToTimedelta()) if info.HasField('oldest_mail_age') else '-'}")
    print(f"oldest ready     {human(info.oldest_ready_age.ToTimedelta()) if info.HasField('oldest_ready_age') else '-'}")
    print_policy(info.retry_policy)
    print(f"browse start     {info.browse_start.ToDatetime().isoformat()}Z")
    print(f"content start    {info.content_start.ToDatetime().isoformat()}Z")
    cfg = info.configuration
    print(f"slice window     {human(cfg.slice_window.ToTimedelta())}, buckets {cfg.bucket_count}, "
          f"browse start pace {cfg.update_browse_start_pace}")
    for t in info.throttles:
        print(f"throttle         {t.destination} ({t.queue or 'every queue'}): rate {throttle.rate_text(t.rate)}, "
              f"concurrency {t.concurrency or '-'}")


def cmd_size(c: Client, a: argparse.Namespace) -> None:
    print(c.browse.GetSize(browse_pb2.GetSizeRequest(queue=a.queue, exact=a.exact)).size)


#: qshape's geometric age buckets, in minutes.
SHAPE_BUCKETS = (5, 10, 20, 40, 80, 160, 320, 640, 1280)


def shape_table(mails: Iterator[tuple[list[str], float]], top: int) -> list[list[str]]:
    """Rows of qshape's table (TOTAL first, then the ``top`` busiest domains) from
    (recipients, age in minutes) pairs: one count per recipient, like qshape."""
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0] * (len(SHAPE_BUCKETS) + 2))
    for recipients, age in mails:
        column = 1 + next((i for i, limit in enumerate(SHAPE_BUCKETS) if age < limit), len(SHAPE_BUCKETS))
        for r in recipients:
            for key in ("TOTAL", r.rsplit("@", 1)[-1].lower()):
                counts[key][0] += 1
                counts[key][column] += 1
    total = counts.pop("TOTAL", [0] * (len(SHAPE_BUCKETS) + 2))
    busiest = sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return [[name, *map(str, row)] for name, row in [("TOTAL", total), *busiest]]


def cmd_shape(c: Client, a: argparse.Namespace) -> None:
    now = time.time()
    mails = ((list(r.mail.mail.recipients), (now - r.mail.enqueued_at.ToNanoseconds() / 1e9) / 60)
             for r in c.browse.Browse(browse_pb2.BrowseRequest(queue=a.queue)))
    header = ["", "T", *map(str, SHAPE_BUCKETS), f"{SHAPE_BUCKETS[-1]}+"]
    rows = shape_table(mails, a.top)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print(" ".join(str(x).rjust(w) for x, w in zip(row, widths)))
    shaped = c.admin.ListThrottles(admin_pb2.ListThrottlesRequest(queue=a.queue))
    if shaped.throttles or shaped.effects or shaped.destinations:
        print()
        throttle.print_status(shaped)


def cmd_reconcile(c: Client, a: argparse.Namespace) -> None:
    r = c.admin.ReconcileCounters(admin_pb2.ReconcileCountersRequest(queue=a.queue))
    print(f"size {r.size_before} -> {r.size_after}, delayed {r.delayed_before} -> {r.delayed_after}, "
          f"held {r.held_before} -> {r.held_after}")


def cmd_create(c: Client, a: argparse.Namespace) -> int:
    """Idempotent. A queue that exists keeps its retry policy (CreateQueue never changes it): when
    the one asked for differs, that is said, with the command that sets it, and the exit is 1 (a
    provisioning script must not believe its policy applied)."""
    wanted = retry_policy(a)
    created = c.admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=a.queue, retry_policy=wanted)).created
    if created or wanted is None:
        print(f"{a.queue}: {'created' if created else 'already exists'}")
        return EXIT_OK
    current = c.browse.GetQueue(browse_pb2.GetQueueRequest(queue=a.queue)).queue_info.retry_policy
    differs = [f.name for f, value in wanted.ListFields() if getattr(current, f.name) != value]
    if not differs:
        print(f"{a.queue}: already exists, with that retry policy")
        return EXIT_OK
    print(f"mailq create: {a.queue} already exists with another retry policy ({', '.join(differs)} differ), left "
          f"unchanged: set it with `mailq retry-policy {a.queue}` and the same options", file=sys.stderr)
    return EXIT_ERROR


def cmd_retry_policy(c: Client, a: argparse.Namespace) -> None:
    wanted = retry_policy(a)
    if wanted is None:
        policy = c.browse.GetQueue(browse_pb2.GetQueueRequest(queue=a.queue)).queue_info.retry_policy
    else:
        policy = c.admin.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(queue=a.queue, retry_policy=wanted)).retry_policy
    print_policy(policy)


def cmd_drop(c: Client, a: argparse.Namespace) -> None:
    last = follow(c.admin.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=a.queue, force=a.force)),
                  lambda r: f"deleting queue {a.queue}: {r.phase}, {r.mails_deleted} mail(s) deleted, "
                            f"{r.dead_letters_purged} dead letter(s) purged",
                  f"mailq drop: the delete of {a.queue} did not finish: run it again to complete it")
    print(f"queue {a.queue} deleted ({last.mails_deleted} live mail(s) deleted and {last.dead_letters_purged} dead "
          "letter(s) purged with it)")


def cmd_config(c: Client, a: argparse.Namespace) -> None:
    """``get`` prints the view configuration; ``set`` changes the options given (the others keep
    their value) and prints each change. It applies to every queue of the install, and only one
    way (slice window to a divisor of itself, bucket count up): it reads no input, so nothing is
    changed by what is piped into it."""
    if a.action == "set" and a.slice_window is None and not (a.buckets or a.pace):
        raise UsageError("mailq config set: give --slice-window, --buckets or --pace (it changes every queue of the install)")
    current = c.admin.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
    if a.action == "get":
        print(f"slice_window {human(current.slice_window.ToTimedelta())}")
        print(f"bucket_count {current.bucket_count}")
        print(f"update_browse_start_pace {current.update_browse_start_pace}")
        return
    wanted = browse_pb2.ViewConfiguration()
    wanted.CopyFrom(current)
    if a.slice_window is not None:
        wanted.slice_window.FromTimedelta(a.slice_window)
    if a.buckets:
        wanted.bucket_count = a.buckets
    if a.pace:
        wanted.update_browse_start_pace = a.pace
    new = c.admin.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=wanted)).configuration
    for name, before, after in (("slice_window", human(current.slice_window.ToTimedelta()), human(new.slice_window.ToTimedelta())),
                                ("bucket_count", current.bucket_count, new.bucket_count),
                                ("update_browse_start_pace", current.update_browse_start_pace, new.update_browse_start_pace)):
        print(f"{name} {after}" if before == after else f"{name} {before} -> {after}")


def register(sub: Any) -> None:
    sub.add_parser("queues", help="list every queue").set_defaults(fn=cmd_queues)
    s = queue_command(sub, "show", cmd_show, "size (ready, delayed), oldest mail age, retry policy, configuration")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--exact", action="store_true", help="read every live mail instead of the counters")
    s = queue_command(sub, "size", cmd_size, "the size from the queue's counters (cheap), or by reading every live mail")
    s.add_argument("--exact", action="store_true", help="read every live mail instead of the counters")
    for name, fn, help_ in (("create", cmd_create, "create a queue (idempotent), with its retry policy"),
                            ("retry-policy", cmd_retry_policy, "change a queue's retry policy (unset options keep their value)")):
        s = queue_command(sub, name, fn, help_)
        s.add_argument("--initial-backoff", type=duration_arg)
        s.add_argument("--multiplier", type=real(minimum=1.0, maximum=1e6))  # 0 would go out as "unset"
        s.add_argument("--max-backoff", type=duration_arg)
        s.add_argument("--max-attempts", type=whole(minimum=1))
        s.add_argument("--max-age", type=duration_arg)
    s = queue_command(sub, "shape", cmd_shape, "Postfix qshape: recipient domain x age, then each shaped destination")
    s.add_argument("--top", type=whole(), default=20, help="domains shown (default 20)")
    queue_command(sub, "reconcile", cmd_reconcile, "rewrite the queue's counters from an exact count")
    s = queue_command(sub, "drop", cmd_drop, "delete a queue (with its live mails and dead letters: --force)")
    s.add_argument("--force", action="store_true", help="delete its live mails with it")
    s = sub.add_parser("config", help="get or set the view configuration (slice window, buckets, browse-start pace) of every queue")
    s.add_argument("action", choices=("get", "set"))
    s.add_argument("--slice-window", type=positive_duration_arg)
    s.add_argument("--buckets", type=whole(1))
    s.add_argument("--pace", type=whole(1))
    s.set_defaults(fn=cmd_config)
