"""mailq: see and manage every queue of a cluster from one place.

    mailq queues                         list queues
    mailq show Q                         size (ready, delayed), oldest mail, retry policy, configuration
    mailq browse Q [--sender S] [--recipient R] [--name N] [--id ENQUEUE_ID] [--ready | --delayed] [--limit N] [--json]
    mailq size Q [--exact]               from the queue's counters (cheap) or by reading every live mail
    mailq shape Q [--top 20]             Postfix qshape: recipient domain x age buckets (minutes), then
                                         each shaped destination: in flight, delivered/s, waiting, limits
    mailq reconcile Q                    rewrite the queue's counters from an exact count
    mailq create Q [--initial-backoff 1m] [--multiplier 2] [--max-backoff 1h] [--max-attempts 20] [--max-age 5d]
    mailq retry-policy Q [--initial-backoff 1m] [--multiplier 2] [--max-backoff 1h] [--max-attempts 20] [--max-age 5d]
    mailq delete Q (--sender S | --recipient R | --name N)
    mailq clear Q
    mailq flush Q [--sender S | --recipient R | --domain D | --name N]
    mailq republish Q --older-than 1h
    mailq config get | config set [--slice-window 1h] [--buckets N] [--pace N]
    mailq hold|bounce [--queue Q] [--domain D] [--sender S] [--name N] [--for 1d] [--reason R]
    mailq rules                          the hold and bounce rules in force
    mailq release RULE_ID                lift a rule (held mails go out now, in order)
    mailq throttle set DEST [--queue Q] [--rate 20/s] [--concurrency 5]   limit a destination (domain or site)
    mailq throttle clear DEST [--queue Q] | list [--queue Q] | resume DEST
    mailq throttle site NAME DOMAIN... | drop-site NAME
    mailq throttle rule ID --pattern RE --threshold 3 --window 5m (--suspend | --slow 1/s) --for 10m | drop-rule ID
    mailq dead list Q [--reason expired ...] [--sender S] [--recipient R] [--name N] [--limit N] [--json]
    mailq dead count Q [--exact]         dead letters by reason
    mailq dead redrive Q [--to T] [--rate 100] [--keep-attempts] [--limit N] [filters]   back to a queue, N/s
    mailq dead purge Q (--older-than 7d | filters | --all)
    mailq enqueue Q FILE.eml --from A --to B [--to C] [--name N] [--delay 10m] [--priority high|normal|low]
    mailq dequeue Q [-n N] [--ack success|retry|reject] [--retry-after 5m] [--out DIR]

Targets: --target/--host (default localhost, services on their default ports) or --enqueue / --dequeue /
--browse / --blob HOST:PORT; --token (or MAILQ_TOKEN) for a cluster with access control.
"""

from __future__ import annotations

import argparse
import json
import os
import queue as q
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format, timestamp_pb2

from mailq import dead, throttle
from mailq.common import duration, duration_arg, follow, print_table
from mailqueue.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    blob_pb2,
    blob_pb2_grpc,
    browse_pb2,
    browse_pb2_grpc,
    dequeue_pb2,
    dequeue_pb2_grpc,
    enqueue_pb2,
    enqueue_pb2_grpc,
    mail_pb2,
)
from services.adapters.grpc_channels import blocking_channel
from services.domain.durations import human, parse_duration
from services.runtime.server_settings import DEFAULT_PORTS

CHUNK = 1024 * 1024
HINTS = {
    grpc.StatusCode.UNAVAILABLE: "is the service up and reachable? (`make run` locally; check --host / the target flags). "
                                 "The services serve TLS by default: pass --tls-ca (make run: .stack/pki/ca.crt) or set MAILQ_TLS_CA",
    grpc.StatusCode.UNAUTHENTICATED: "pass --token or set MAILQ_TOKEN",
    grpc.StatusCode.PERMISSION_DENIED: "this token's role may not do that; use an admin token",
    grpc.StatusCode.NOT_FOUND: "check the name (`mailq queues` lists queues)",
    grpc.StatusCode.UNIMPLEMENTED: "the server is older than this mailq",
}


class Client:
    def __init__(self, a: argparse.Namespace) -> None:
        token = a.token or os.environ.get("MAILQ_TOKEN", "")

        def target(name: str) -> str:
            return getattr(a, name) or os.environ.get(f"MAILQ_{name.upper()}") or f"{a.host}:{DEFAULT_PORTS[name]}"

        tls = tls_credentials(a)
        self.enqueue = enqueue_pb2_grpc.EnqueueServiceStub(blocking_channel(target("enqueue"), token, tls))
        self.dequeue = dequeue_pb2_grpc.DequeueServiceStub(blocking_channel(target("dequeue"), token, tls))
        browse_channel = blocking_channel(target("browse"), token, tls)
        self.browse = browse_pb2_grpc.BrowseServiceStub(browse_channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(browse_channel)
        self.blob = blob_pb2_grpc.BlobServiceStub(blocking_channel(target("blob"), token, tls))


def tls_credentials(a: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS when a CA is given (--tls-ca or $MAILQ_TLS_CA), with a client certificate for mutual TLS."""
    ca = a.tls_ca or os.environ.get("MAILQ_TLS_CA", "")
    cert = a.tls_cert or os.environ.get("MAILQ_TLS_CERT", "")
    key = a.tls_key or os.environ.get("MAILQ_TLS_KEY", "")
    if not ca:
        if cert or key:
            raise SystemExit("mailq: --tls-cert and --tls-key need --tls-ca (the CA that signed the servers)")
        return None
    if bool(cert) != bool(key):
        raise SystemExit("mailq: give both --tls-cert and --tls-key, or neither")

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise SystemExit(f"mailq: {path}: {e.strerror}") from None

    return grpc.ssl_channel_credentials(read(ca), read(key) if key else None, read(cert) if cert else None)



def mail_row(m: mail_pb2.QueuedMail) -> dict[str, Any]:
    return json_format.MessageToDict(m, preserving_proto_field_name=True)


def progress_stream(stream: Iterator[Any], what: str) -> int:
    last = None
    for r in stream:
        last = r.progress
        print(f"\r{what}: {last.scanned} scanned, {last.deleted} deleted", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return last.deleted if last else 0


# ---------------------------------------------------------------- commands
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
        print(json.dumps(json_format.MessageToDict(info, preserving_proto_field_name=True), indent=2))
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


def cmd_browse(c: Client, a: argparse.Namespace) -> None:
    schedule = (browse_pb2.SCHEDULE_FILTER_READY if a.ready else
                browse_pb2.SCHEDULE_FILTER_DELAYED if a.delayed else browse_pb2.SCHEDULE_FILTER_UNSPECIFIED)
    request = browse_pb2.BrowseRequest(queue=a.queue, sender=a.sender or "", recipient=a.recipient or "",
                                       name=a.name or "", limit=a.limit, schedule=schedule, enqueue_id=a.id or "")
    rows = []
    for r in c.browse.Browse(request):
        if a.json:
            print(json.dumps(mail_row(r.mail)))
            continue
        m = r.mail
        due = m.deliver_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S") if m.HasField("deliver_at") else "-"
        rows.append([m.enqueued_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"), m.enqueue_id[:8], str(m.size),
                     m.mail.sender or "<>", ",".join(m.mail.recipients), m.mail.name, due, str(m.attempts)])
    if not a.json:
        print_table(rows, ["ENQUEUED (UTC)", "ID", "SIZE", "SENDER", "RECIPIENTS", "NAME", "DELIVER AT", "ATTEMPTS"])
        print(f"-- {len(rows)} mail(s)", file=sys.stderr)


def cmd_size(c: Client, a: argparse.Namespace) -> None:
    print(c.browse.GetSize(browse_pb2.GetSizeRequest(queue=a.queue, exact=a.exact)).size)


#: qshape's geometric age buckets, in minutes.
SHAPE_BUCKETS = (5, 10, 20, 40, 80, 160, 320, 640, 1280)


def shape_table(mails: Iterator[tuple[list[str], float]], top: int) -> list[list[str]]:
    """Rows of qshape's table (TOTAL first, then the ``top`` busiest domains) from
    (recipients, age in minutes) pairs: one count per recipient, like qshape."""
    import collections

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
    import time

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


def cmd_create(c: Client, a: argparse.Namespace) -> None:
    created = c.admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=a.queue, retry_policy=retry_policy(a))).created
    print(f"{a.queue}: {'created' if created else 'already exists'}")


def cmd_retry_policy(c: Client, a: argparse.Namespace) -> None:
    wanted = retry_policy(a)
    if wanted is None:
        policy = c.browse.GetQueue(browse_pb2.GetQueueRequest(queue=a.queue)).queue_info.retry_policy
    else:
        policy = c.admin.UpdateRetryPolicy(admin_pb2.UpdateRetryPolicyRequest(queue=a.queue, retry_policy=wanted)).retry_policy
    print_policy(policy)


def cmd_delete(c: Client, a: argparse.Namespace) -> None:
    condition = {k: v for k, v in (("sender", a.sender), ("recipient", a.recipient), ("name", a.name)) if v is not None}
    if len(condition) != 1:
        raise SystemExit("mailq delete: give exactly one of --sender, --recipient, --name")
    n = progress_stream(c.admin.DeleteMails(admin_pb2.DeleteMailsRequest(queue=a.queue, **condition)), "deleting")
    print(f"{n} mail(s) deleted")


def cmd_clear(c: Client, a: argparse.Namespace) -> None:
    n = progress_stream(c.admin.ClearQueue(admin_pb2.ClearQueueRequest(queue=a.queue)), "clearing")
    print(f"{n} mail(s) deleted")


def cmd_drop(c: Client, a: argparse.Namespace) -> None:
    last = follow(c.admin.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=a.queue, force=a.force)),
                  lambda r: f"deleting queue {a.queue}: {r.phase}, {r.mails_deleted} mail(s) deleted, "
                            f"{r.dead_letters_purged} dead letter(s) purged",
                  f"mailq drop: the delete of {a.queue} did not finish: run it again to complete it")
    print(f"queue {a.queue} deleted ({last.mails_deleted} live mail(s) deleted and {last.dead_letters_purged} dead "
          "letter(s) purged with it)")


def cmd_move(c: Client, a: argparse.Namespace) -> None:
    schedule = (browse_pb2.SCHEDULE_FILTER_READY if a.ready else browse_pb2.SCHEDULE_FILTER_DELAYED if a.delayed
                else browse_pb2.SCHEDULE_FILTER_UNSPECIFIED)
    request = admin_pb2.MoveMailsRequest(queue=a.queue, to_queue=a.to_queue, sender=a.sender or "", recipient=a.recipient or "",
                                         name=a.name or "", schedule=schedule, limit=a.limit)
    last = follow(c.admin.MoveMails(request), lambda r: f"moving to {a.to_queue}: {r.scanned} scanned, {r.moved} moved",
                  "mailq move: interrupted: run it again (it completes the moves begun first)")
    resumed = f" (and {last.resumed} interrupted move(s) completed)" if last.resumed else ""
    print(f"{last.moved} mail(s) moved to {a.to_queue}{resumed}")


def cmd_flush(c: Client, a: argparse.Namespace) -> None:
    condition = {k: v for k, v in (("sender", a.sender), ("recipient", a.recipient), ("recipient_domain", a.domain),
                                   ("name", a.name)) if v is not None}
    if len(condition) > 1:
        raise SystemExit("mailq flush: give at most one of --sender, --recipient, --domain, --name")
    print(f"{c.admin.Flush(admin_pb2.FlushRequest(queue=a.queue, **condition)).flushed} mail(s) flushed")


def cmd_rule(c: Client, a: argparse.Namespace) -> None:
    rule = admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD if a.command == "hold" else admin_pb2.RULE_KIND_BOUNCE,
                          queue=a.queue or "", recipient_domain=a.domain or "", sender=a.sender or "", name=a.name or "",
                          reason=a.reason or "")
    expires = timestamp_pb2.Timestamp()
    expires.GetCurrentTime()
    expires.FromSeconds(expires.seconds + int(a.lifetime.total_seconds()))
    rule.expires_at.CopyFrom(expires)
    r = c.admin.AddRule(admin_pb2.AddRuleRequest(rule=rule))
    print(f"{r.rule.rule_id} {a.command} until {r.rule.expires_at.ToDatetime().isoformat()}Z"
          + (f"; {r.applied} queued mail(s) bounced" if a.command == "bounce" else ""))


def cmd_rules(c: Client, a: argparse.Namespace) -> None:
    rows = []
    for r in c.admin.ListRules(admin_pb2.ListRulesRequest()).rules:
        condition = " ".join(f"{k}={v}" for k, v in (("queue", r.queue), ("domain", r.recipient_domain),
                                                      ("sender", r.sender), ("name", r.name)) if v)
        rows.append([r.rule_id, admin_pb2.RuleKind.Name(r.kind).removeprefix("RULE_KIND_").lower(), condition,
                     r.expires_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"), r.reason])
    print_table(rows, ["ID", "KIND", "CONDITION", "EXPIRES (UTC)", "REASON"])


def cmd_release(c: Client, a: argparse.Namespace) -> None:
    r = c.admin.LiftRule(admin_pb2.LiftRuleRequest(rule_id=a.rule_id))
    print(f"rule {a.rule_id} lifted; {r.released} held mail(s) released")


def cmd_republish(c: Client, a: argparse.Namespace) -> None:
    r = c.admin.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(queue=a.queue, older_than=duration(a.older_than)))
    print(f"{r.republished} mail(s) republished")


def cmd_config(c: Client, a: argparse.Namespace) -> None:
    current = c.admin.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
    if a.action == "set":
        wanted = browse_pb2.ViewConfiguration()
        wanted.CopyFrom(current)
        if a.slice_window:
            wanted.slice_window.FromTimedelta(a.slice_window)
        if a.buckets:
            wanted.bucket_count = a.buckets
        if a.pace:
            wanted.update_browse_start_pace = a.pace
        current = c.admin.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=wanted)).configuration
    print(f"slice_window {human(current.slice_window.ToTimedelta())}")
    print(f"bucket_count {current.bucket_count}")
    print(f"update_browse_start_pace {current.update_browse_start_pace}")


def cmd_enqueue(c: Client, a: argparse.Namespace) -> None:
    mail = mail_pb2.Mail(name=a.name or os.path.basename(a.file), sender=a.sender, recipients=a.to)

    def requests() -> Iterator[enqueue_pb2.EnqueueStreamRequest]:
        header = enqueue_pb2.EnqueueHeader(queue=a.queue, mail=mail,
                                           priority=getattr(mail_pb2, f"PRIORITY_{a.priority.upper()}"))
        if a.delay is not None:
            header.delay.CopyFrom(duration(a.delay))
        yield enqueue_pb2.EnqueueStreamRequest(header=header)
        with open(a.file, "rb") as f:
            while chunk := f.read(CHUNK):
                yield enqueue_pb2.EnqueueStreamRequest(chunk=chunk)

    r = c.enqueue.EnqueueStream(requests()).receipt
    print(f"{r.enqueue_id} queued ({r.size} bytes)")


def cmd_dequeue(c: Client, a: argparse.Namespace) -> None:
    kind = {"success": dequeue_pb2.OUTCOME_KIND_SUCCESS, "retry": dequeue_pb2.OUTCOME_KIND_RETRY,
            "reject": dequeue_pb2.OUTCOME_KIND_REJECT}[a.ack]
    requests: q.Queue = q.Queue()
    requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=a.queue, prefetch=min(a.n, 64))))
    stream = c.dequeue.Dequeue(iter(requests.get, None))
    timer = threading.Timer(a.wait, stream.cancel)
    timer.start()
    done = 0
    try:
        for r in stream:
            if r.WhichOneof("kind") != "delivery":
                continue
            d = r.delivery
            if a.out:
                os.makedirs(a.out, exist_ok=True)
                content = d.content if d.content_inline else b"".join(
                    p.chunk for b in d.mail.blob_ids for p in c.blob.Get(blob_pb2.GetRequest(blob_id=b)))
                with open(os.path.join(a.out, f"{d.mail.enqueue_id}.eml"), "wb") as f:
                    f.write(content)
            print(f"{d.mail.enqueue_id} {d.mail.mail.sender or '<>'} -> {','.join(d.mail.mail.recipients)} "
                  f"[{a.ack}] attempts {d.mail.attempts}")
            outcome = dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=kind)
            if a.retry_after is not None:
                outcome.retry_after.CopyFrom(duration(a.retry_after))
            requests.put(dequeue_pb2.DequeueRequest(outcome=outcome))
            done += 1
            if done >= a.n:
                break
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            raise
    finally:
        timer.cancel()
        requests.put(None)  # half-close: the server settles the outcomes sent, then ends the stream
        for _ in stream:
            pass
    print(f"{done} mail(s) dequeued", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mailq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", "--target", dest="host", default=os.environ.get("MAILQ_HOST", "localhost"),
                   help="cluster address: every service on its default port there (default: $MAILQ_HOST or localhost)")
    for name in DEFAULT_PORTS:
        p.add_argument(f"--{name}", metavar="HOST:PORT", help=f"{name}_svc target (default: --host:{DEFAULT_PORTS[name]})")
    p.add_argument("--token", help="bearer token (default: $MAILQ_TOKEN)")
    p.add_argument("--tls-ca", metavar="PEM", help="connect with TLS, trusting this CA (default: $MAILQ_TLS_CA; unset: plaintext)")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate for mutual TLS (default: $MAILQ_TLS_CERT)")
    p.add_argument("--tls-key", metavar="PEM", help="its key (default: $MAILQ_TLS_KEY)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("queues").set_defaults(fn=cmd_queues)
    for name, fn in (("show", cmd_show), ("browse", cmd_browse), ("size", cmd_size), ("create", cmd_create),
                     ("delete", cmd_delete), ("clear", cmd_clear), ("flush", cmd_flush), ("republish", cmd_republish),
                     ("enqueue", cmd_enqueue), ("dequeue", cmd_dequeue), ("retry-policy", cmd_retry_policy),
                     ("shape", cmd_shape), ("reconcile", cmd_reconcile), ("drop", cmd_drop), ("move", cmd_move)):
        s = sub.add_parser(name)
        s.add_argument("queue")
        s.set_defaults(fn=fn)
        if name in ("show", "browse"):
            s.add_argument("--json", action="store_true", help="machine-readable output")
        if name in ("show", "size"):
            s.add_argument("--exact", action="store_true", help="read every live mail instead of the counters")
        if name == "shape":
            s.add_argument("--top", type=int, default=20, help="domains shown (default 20)")
        if name in ("browse", "delete", "flush", "move"):
            s.add_argument("--sender")
            s.add_argument("--recipient")
            s.add_argument("--name")
        if name == "flush":
            s.add_argument("--domain", help="only mails with a recipient in this domain")
        if name == "browse":
            s.add_argument("--limit", type=int, default=0)
            s.add_argument("--id", help="only the mail with this enqueue id (read from an index)")
            which = s.add_mutually_exclusive_group()
            which.add_argument("--ready", action="store_true", help="only mails deliverable now")
            which.add_argument("--delayed", action="store_true", help="only mails waiting for their deliver_at")
        if name in ("create", "retry-policy"):
            s.add_argument("--initial-backoff", type=duration_arg)
            s.add_argument("--multiplier", type=float)
            s.add_argument("--max-backoff", type=duration_arg)
            s.add_argument("--max-attempts", type=int)
            s.add_argument("--max-age", type=duration_arg)
        if name == "move":
            s.add_argument("to_queue", metavar="TO")
            s.add_argument("--limit", type=int, default=0, help="at most this many mails")
            which = s.add_mutually_exclusive_group()
            which.add_argument("--ready", action="store_true", help="only mails deliverable now")
            which.add_argument("--delayed", action="store_true", help="only delayed or held mails")
        if name == "drop":
            s.add_argument("--force", action="store_true", help="delete its live mails with it")
        if name == "republish":
            s.add_argument("--older-than", type=duration_arg, required=True)
        if name == "enqueue":
            s.add_argument("file")
            s.add_argument("--from", dest="sender", default="", help="envelope sender (default: <>)")
            s.add_argument("--to", action="append", required=True, help="recipient (repeat for several)")
            s.add_argument("--name")
            s.add_argument("--delay", type=duration_arg, help="deliver no earlier than this from now (e.g. 10m)")
            s.add_argument("--priority", choices=("high", "normal", "low"), default="normal")
        if name == "dequeue":
            s.add_argument("-n", type=int, default=1, help="how many mails (default 1)")
            s.add_argument("--ack", choices=("success", "retry", "reject"), default="success")
            s.add_argument("--retry-after", type=duration_arg, help="with --ack retry: deliver again after this")
            s.add_argument("--out", help="write each mail's content to DIR/<id>.eml")
            s.add_argument("--wait", type=float, default=10, help="give up after this many seconds (default 10)")
    for kind in ("hold", "bounce"):
        r = sub.add_parser(kind, help=f"{kind} the mails matching a condition (queued ones and new ones)")
        r.add_argument("--queue")
        r.add_argument("--domain", help="recipient domain")
        r.add_argument("--sender")
        r.add_argument("--name")
        r.add_argument("--for", dest="lifetime", type=duration_arg, default=parse_duration("1d"),
                       help="how long the rule lives (default 1d, at most 30d)")
        r.add_argument("--reason")
        r.set_defaults(fn=cmd_rule)
    sub.add_parser("rules").set_defaults(fn=cmd_rules)
    r = sub.add_parser("release", help="lift a rule")
    r.add_argument("rule_id")
    r.set_defaults(fn=cmd_release)
    c = sub.add_parser("config")
    c.add_argument("action", choices=("get", "set"))
    c.add_argument("--slice-window", type=duration_arg)
    c.add_argument("--buckets", type=int)
    c.add_argument("--pace", type=int)
    c.set_defaults(fn=cmd_config)
    throttle.register(sub)
    dead.register(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    try:
        a.fn(Client(a), a)
    except grpc.RpcError as e:
        hint = HINTS.get(e.code(), "")
        print(f"mailq {a.command}: {e.code().name}: {e.details()}" + (f"\n  hint: {hint}" if hint else ""), file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        print(f"mailq {a.command}: {e}", file=sys.stderr)
        sys.exit(1)
