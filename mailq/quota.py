"""mailq quota: enqueue quotas of tenants, senders, sender domains and queues (AdminService's
quota RPCs; services/domain/quotas.py has the rules)."""

from __future__ import annotations

import argparse
from typing import Any

from mailq.common import UsageError, print_table, real, whole
from mailqueue.v1 import admin_pb2, quotas_pb2

_KINDS = {"tenant": quotas_pb2.QUOTA_KIND_TENANT, "sender": quotas_pb2.QUOTA_KIND_SENDER,
          "sender-domain": quotas_pb2.QUOTA_KIND_SENDER_DOMAIN, "queue": quotas_pb2.QUOTA_KIND_QUEUE}
_NAMES = {v: k for k, v in _KINDS.items()}


def _text(q: quotas_pb2.Quota) -> list[str]:
    mails = f"{q.mails_per_s:g}/s burst {q.burst_mails}" if q.HasField("mails_per_s") else "-"
    size = f"{q.bytes_per_s:g} B/s burst {q.burst_bytes}" if q.HasField("bytes_per_s") else "-"
    depth = str(q.max_queued_mails) if q.HasField("max_queued_mails") else "-"
    depth_bytes = str(q.max_queued_bytes) if q.HasField("max_queued_bytes") else "-"
    exempt = ", ".join([*(["bounces"] if q.exempt_bounces else []), *q.exempt_senders]) or "-"
    return [_NAMES.get(q.kind, "?"), q.subject, mails, size, depth, depth_bytes, exempt]


HEADER = ["KIND", "SUBJECT", "MAILS", "BYTES", "MAX QUEUED", "MAX QUEUED BYTES", "EXEMPT"]


def cmd_set(c: Any, a: argparse.Namespace) -> None:
    if a.mails_per_s is None and a.bytes_per_s is None and a.max_queued is None and a.max_queued_bytes is None:
        raise UsageError("mailq quota set: give --mails-per-s, --bytes-per-s, --max-queued or --max-queued-bytes")
    q = quotas_pb2.Quota(kind=_KINDS[a.kind], subject=a.subject, burst_mails=a.burst_mails or 0, burst_bytes=a.burst_bytes or 0,
                         exempt_bounces=a.exempt_bounces, exempt_senders=a.exempt_sender or [])
    if a.mails_per_s is not None:
        q.mails_per_s = a.mails_per_s
    if a.bytes_per_s is not None:
        q.bytes_per_s = a.bytes_per_s
    if a.max_queued is not None:
        q.max_queued_mails = a.max_queued
    if a.max_queued_bytes is not None:
        q.max_queued_bytes = a.max_queued_bytes
    r = c.admin.SetQuota(admin_pb2.SetQuotaRequest(quota=q)).quota
    print_table([_text(r)], HEADER)


def cmd_clear(c: Any, a: argparse.Namespace) -> None:
    r = c.admin.ClearQuota(admin_pb2.ClearQuotaRequest(kind=_KINDS[a.kind], subject=a.subject))
    print("cleared" if r.cleared else "no such quota")


def cmd_list(c: Any, a: argparse.Namespace) -> None:
    r = c.admin.ListQuotas(admin_pb2.ListQuotasRequest(kind=_KINDS[a.kind] if a.kind else quotas_pb2.QUOTA_KIND_UNSPECIFIED))
    print_table([_text(q) for q in r.quotas], HEADER)
    print(f"\n{r.members} enqueue replica(s) share the rates")


def register(sub: Any) -> None:
    t = sub.add_parser("quota", help="enqueue quotas of tenants, senders, sender domains and queues").add_subparsers(
        dest="action", required=True)
    s = t.add_parser("set", help="set (or replace) a subject's quota: over it, Enqueue answers RESOURCE_EXHAUSTED")
    s.add_argument("kind", choices=sorted(_KINDS))
    s.add_argument("subject", help="the tenant name, sender address, sender domain or queue")
    s.add_argument("--mails-per-s", type=real(above=True), help="mails per second at most")
    s.add_argument("--burst-mails", type=whole(maximum=2**63 - 1), help="mails at once above the rate (default 1)")
    s.add_argument("--bytes-per-s", type=real(above=True), help="content bytes per second at most")
    s.add_argument("--burst-bytes", type=whole(maximum=2**63 - 1), help="bytes at once above the rate (at least the largest mail)")
    s.add_argument("--max-queued", type=whole(maximum=2**63 - 1), help="queues only: refuse new mail while the queue holds this many")
    s.add_argument("--max-queued-bytes", type=whole(maximum=2**63 - 1),
                   help="queues only: refuse new mail while the queue's mails hold this many content bytes")
    s.add_argument("--exempt-bounces", action="store_true", help="bounces (the empty sender) pass this quota")
    s.add_argument("--exempt-sender", action="append", metavar="ADDRESS", help="this sender passes this quota (repeatable)")
    s.set_defaults(fn=cmd_set)
    s = t.add_parser("clear", help="remove a subject's quota")
    s.add_argument("kind", choices=sorted(_KINDS))
    s.add_argument("subject")
    s.set_defaults(fn=cmd_clear)
    s = t.add_parser("list", help="the quotas, by kind then subject, and how many enqueue replicas share them")
    s.add_argument("--kind", choices=sorted(_KINDS))
    s.set_defaults(fn=cmd_list)
