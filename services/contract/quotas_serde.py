"""Enqueue quotas' protobuf <-> domain translation (mailqueue/v1/quotas.proto)."""

from __future__ import annotations

from mailqueue.v1 import quotas_pb2
from services.domain import quotas
from services.domain.errors import InvalidArgument

_KINDS = {quotas_pb2.QUOTA_KIND_TENANT: "tenant", quotas_pb2.QUOTA_KIND_SENDER: "sender",
          quotas_pb2.QUOTA_KIND_SENDER_DOMAIN: "sender_domain", quotas_pb2.QUOTA_KIND_QUEUE: "queue"}
_KINDS_PB = {v: k for k, v in _KINDS.items()}


def kind_from_proto(value: int) -> str:
    if value not in _KINDS:
        raise InvalidArgument("kind must be TENANT, SENDER, SENDER_DOMAIN or QUEUE")
    return _KINDS[value]


def kind_to_proto(kind: str) -> quotas_pb2.QuotaKind.ValueType:
    return _KINDS_PB[kind]


def quota_from_proto(pb: quotas_pb2.Quota) -> quotas.Quota:
    """The quota of ``pb``, validated (InvalidArgument naming the field)."""
    if pb.burst_mails > 2**31 or pb.burst_bytes > 2**62 or pb.max_queued_mails > 2**62 or pb.max_queued_bytes > 2**62:
        raise InvalidArgument("burst_mails, burst_bytes, max_queued_mails or max_queued_bytes is out of range")
    return quotas.validate(quotas.Quota(
        kind=kind_from_proto(pb.kind), subject=pb.subject,
        mails_per_s=pb.mails_per_s if pb.HasField("mails_per_s") else None, burst_mails=pb.burst_mails or 1,
        bytes_per_s=pb.bytes_per_s if pb.HasField("bytes_per_s") else None, burst_bytes=pb.burst_bytes,
        max_queued_mails=pb.max_queued_mails if pb.HasField("max_queued_mails") else None,
        max_queued_bytes=pb.max_queued_bytes if pb.HasField("max_queued_bytes") else None,
        exempt_bounces=pb.exempt_bounces, exempt_senders=tuple(pb.exempt_senders),
    ))


def quota_to_proto(q: quotas.Quota) -> quotas_pb2.Quota:
    pb = quotas_pb2.Quota(kind=kind_to_proto(q.kind), subject=q.subject, burst_mails=q.burst_mails,
                          burst_bytes=q.burst_bytes, exempt_bounces=q.exempt_bounces, exempt_senders=list(q.exempt_senders))
    if q.mails_per_s is not None:
        pb.mails_per_s = q.mails_per_s
    if q.bytes_per_s is not None:
        pb.bytes_per_s = q.bytes_per_s
    if q.max_queued_mails is not None:
        pb.max_queued_mails = q.max_queued_mails
    if q.max_queued_bytes is not None:
        pb.max_queued_bytes = q.max_queued_bytes
    return pb
