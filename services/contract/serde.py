"""All protobuf <-> domain translation, as paired to_proto / from_proto functions.

One place to look when a field is lost; tests/unit/test_serde.py round-trips every field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from mailqueue.v1 import admin_pb2, browse_pb2, mail_pb2
from services.domain import counts, filters, model, validation
from services.domain.errors import InvalidArgument

_UTC = dt.timezone.utc
#: The instants a client may send: what Cassandra's timestamps and the driver's reads hold safely.
TIMESTAMP_MIN = dt.datetime(1000, 1, 1, tzinfo=_UTC)
TIMESTAMP_MAX = dt.datetime(9000, 1, 1, tzinfo=_UTC)
#: The longest Duration any request may carry (one century); each field has a tighter rule of its own.
DURATION_MAX = dt.timedelta(days=36525)
_NANOS = 999_999_999
#: The largest Duration protobuf allows (10,000 years), either sign.
_MAX_DURATION_S = 315_576_000_000


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)


def timestamp_to_proto(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """An instant as a Timestamp (a naive one read as local time, as ``astimezone`` does); computed
    from its distance to the epoch: a third of ``FromDatetime``'s cost (two per delivered mail)."""
    if value.tzinfo is None:
        value = value.astimezone(_UTC)
    d = value - _EPOCH
    return timestamp_pb2.Timestamp(seconds=d.days * 86_400 + d.seconds, nanos=d.microseconds * 1000)


def timestamp_from_proto(ts: timestamp_pb2.Timestamp, field: str = "timestamp") -> dt.datetime:
    """A client's Timestamp as a datetime; InvalidArgument outside [TIMESTAMP_MIN, TIMESTAMP_MAX)."""
    low, high = TIMESTAMP_MIN.timestamp(), TIMESTAMP_MAX.timestamp()
    if not 0 <= ts.nanos <= _NANOS:
        raise InvalidArgument(f"{field} is not a valid Timestamp: nanos {ts.nanos} is outside 0 to {_NANOS}")
    if not low <= ts.seconds < high:
        raise InvalidArgument(
            f"{field} is out of range: use an instant from {TIMESTAMP_MIN:%Y-%m-%d} to {TIMESTAMP_MAX:%Y-%m-%d} (UTC)"
        )
    return ts.ToDatetime(tzinfo=_UTC)


def duration_to_proto(value: dt.timedelta) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


def duration_from_proto(
    d: duration_pb2.Duration, field: str = "duration", maximum: dt.timedelta = DURATION_MAX, negative: bool = False,
) -> dt.timedelta:
    """A client's Duration as a timedelta; InvalidArgument when malformed, over ``maximum`` or
    (unless ``negative``) below zero."""
    if abs(d.nanos) > _NANOS or (d.seconds > 0 and d.nanos < 0) or (d.seconds < 0 and d.nanos > 0):
        raise InvalidArgument(f"{field} is not a valid Duration (seconds and nanos must have the same sign)")
    limit = int(maximum.total_seconds())
    if d.seconds > limit or d.seconds < -limit:
        raise InvalidArgument(f"{field} is out of range: at most {limit} seconds")
    if d.seconds < 0 or d.nanos < 0:
        if not negative:
            raise InvalidArgument(f"{field} must not be negative")
    return d.ToTimedelta()


def schedule_from_proto(pb: Any) -> tuple[dt.datetime | None, dt.timedelta | None]:
    """The ``schedule`` oneof of an EnqueueRequest / EnqueueHeader: (deliver_at, delay)."""
    from services.domain.delays import MAX_DELAY

    kind = pb.WhichOneof("schedule")
    if kind == "deliver_at":
        return timestamp_from_proto(pb.deliver_at, "deliver_at"), None
    if kind == "delay":
        if pb.delay.seconds < 0 or pb.delay.nanos < 0:  # a negative delay, however large, means now (the proto says so)
            duration_from_proto(pb.delay, "delay", dt.timedelta(seconds=_MAX_DURATION_S), negative=True)  # a valid Duration
            return None, dt.timedelta(0)
        return None, duration_from_proto(pb.delay, "delay", MAX_DELAY + dt.timedelta(days=1), negative=True)
    return None, None


_PRIORITIES = {mail_pb2.PRIORITY_HIGH: "high", mail_pb2.PRIORITY_NORMAL: "normal", mail_pb2.PRIORITY_LOW: "low",
               mail_pb2.PRIORITY_UNSPECIFIED: "normal"}


def priority_from_proto(value: int) -> str:
    if value not in _PRIORITIES:
        raise InvalidArgument(f"priority {value} is unknown: use PRIORITY_HIGH, PRIORITY_NORMAL or PRIORITY_LOW")
    return _PRIORITIES[value]


def priority_to_proto(priority: str) -> int:
    return {"high": mail_pb2.PRIORITY_HIGH, "low": mail_pb2.PRIORITY_LOW}.get(priority, mail_pb2.PRIORITY_NORMAL)


def retry_after_from_proto(pb: Any) -> dt.timedelta | None:
    """An Outcome's retry_after: None when unset (the queue's policy decides); negative is now."""
    from services.domain.delays import MAX_DELAY

    if not pb.HasField("retry_after"):
        return None
    d = pb.retry_after
    if d.seconds < 0 or d.nanos < 0:  # a negative wait of any size means now, as Enqueue's negative delay
        duration_from_proto(d, "retry_after", dt.timedelta(seconds=_MAX_DURATION_S), negative=True)  # a valid Duration
        return dt.timedelta(0)
    return duration_from_proto(d, "retry_after", MAX_DELAY)


def retry_policy_to_proto(p: model.RetryPolicy) -> browse_pb2.RetryPolicy:
    return browse_pb2.RetryPolicy(
        initial_backoff=duration_to_proto(p.initial_backoff), multiplier=p.multiplier,
        max_backoff=duration_to_proto(p.max_backoff), max_attempts=p.max_attempts, max_age=duration_to_proto(p.max_age),
    )


def retry_policy_from_proto(pb: browse_pb2.RetryPolicy, base: model.RetryPolicy) -> model.RetryPolicy:
    """``base`` with the fields ``pb`` sets (Durations by presence, numbers when not zero)."""
    from services.domain.delays import MAX_DELAY

    changes: dict[str, Any] = {}
    for field in ("initial_backoff", "max_backoff", "max_age"):
        if pb.HasField(field):
            changes[field] = duration_from_proto(getattr(pb, field), f"retry_policy.{field}", MAX_DELAY)
    if pb.multiplier:
        changes["multiplier"] = pb.multiplier
    if pb.max_attempts:
        changes["max_attempts"] = pb.max_attempts
    return dataclasses.replace(base, **changes)


_RULE_KINDS = {"hold": admin_pb2.RULE_KIND_HOLD, "bounce": admin_pb2.RULE_KIND_BOUNCE}


def rule_to_proto(r: model.Rule) -> admin_pb2.Rule:
    return admin_pb2.Rule(
        rule_id=str(r.rule_id), kind=_RULE_KINDS[r.kind], queue=r.queue, recipient_domain=r.recipient_domain,
        sender=r.sender, name=r.name, reason=r.reason,
        expires_at=timestamp_to_proto(r.expires_at), created_at=timestamp_to_proto(r.created_at),
    )


def rule_from_proto(pb: Any, now: dt.datetime) -> model.Rule:
    """A new rule from a client (id and creation time are assigned by the server)."""
    from services.domain.rules import DEFAULT_LIFETIME

    kinds = {v: k for k, v in _RULE_KINDS.items()}
    return model.Rule(
        rule_id=uuid.UUID(int=0), kind=kinds.get(pb.kind, ""), created_at=now,
        expires_at=timestamp_from_proto(pb.expires_at, "rule.expires_at") if pb.HasField("expires_at") else now + DEFAULT_LIFETIME,
        queue=pb.queue, recipient_domain=pb.recipient_domain, sender=pb.sender, name=pb.name, reason=pb.reason,
    )


def mail_to_proto(m: model.Mail) -> mail_pb2.Mail:
    pb = mail_pb2.Mail(
        name=m.name,
        sender=m.sender,
        recipients=list(m.recipients),
        state=m.state,
        error_message=m.error_message,
        remote_host=m.remote_host,
        remote_addr=m.remote_addr,
        attributes=m.attributes,
        per_recipient_headers=[
            mail_pb2.PerRecipientHeaders(
                recipient=p.recipient, headers=[mail_pb2.Header(name=h.name, value=h.value) for h in p.headers]
            )
            for p in m.per_recipient_headers
        ],
    )
    if m.last_updated is not None:
        pb.last_updated.CopyFrom(timestamp_to_proto(m.last_updated))
    return pb


def mail_from_proto(pb: mail_pb2.Mail) -> model.Mail:
    return model.Mail(
        name=pb.name,
        sender=pb.sender,
        recipients=tuple(pb.recipients),
        state=pb.state,
        error_message=pb.error_message,
        remote_host=pb.remote_host,
        remote_addr=pb.remote_addr,
        last_updated=timestamp_from_proto(pb.last_updated, "mail.last_updated") if pb.HasField("last_updated") else None,
        attributes=dict(pb.attributes),
        per_recipient_headers=tuple(
            model.PerRecipientHeaders(p.recipient, tuple(model.Header(h.name, h.value) for h in p.headers))
            for p in pb.per_recipient_headers
        ),
    )


def queued_mail_to_proto(q: model.QueuedMail) -> mail_pb2.QueuedMail:
    """The public form (the generation is not in it: it travels in a broker header)."""
    pb = mail_pb2.QueuedMail(
        queue=q.queue,
        enqueue_id=str(q.enqueue_id),
        enqueued_at=timestamp_to_proto(q.enqueued_at),
        mail=mail_to_proto(q.mail),
        blob_ids=list(q.blob_ids),
        size=q.size,
        slice_start=timestamp_to_proto(q.slice_start),
        bucket=q.bucket,
        attempts=q.attempts,
        last_error=q.last_error,
        priority=priority_to_proto(q.priority),
        traceparent=q.traceparent,
    )
    if q.deliver_at is not None:
        pb.deliver_at.CopyFrom(timestamp_to_proto(q.deliver_at))
    return pb


def queued_mail_from_proto(pb: mail_pb2.QueuedMail) -> model.QueuedMail:
    return model.QueuedMail(
        queue=pb.queue,
        enqueue_id=uuid.UUID(pb.enqueue_id),
        enqueued_at=timestamp_from_proto(pb.enqueued_at),
        mail=mail_from_proto(pb.mail),
        blob_ids=tuple(pb.blob_ids),
        size=pb.size,
        slice_start=timestamp_from_proto(pb.slice_start),
        bucket=pb.bucket,
        deliver_at=timestamp_from_proto(pb.deliver_at) if pb.HasField("deliver_at") else None,
        attempts=pb.attempts,
        last_error=pb.last_error,
        priority=priority_from_proto(pb.priority),
        traceparent=pb.traceparent,
    )


def queued_mail_to_bytes(q: model.QueuedMail) -> bytes:
    """What a broker message carries (the generation travels in a header of its own)."""
    return queued_mail_to_proto(q).SerializeToString()


def queued_mail_from_bytes(body: bytes, generation: int = 0) -> model.QueuedMail:
    """The mail a broker message carries, with its header's generation. Raises on garbage."""
    return dataclasses.replace(queued_mail_from_proto(mail_pb2.QueuedMail.FromString(body)), generation=generation)


def queue_info_to_proto(i: model.QueueInfo) -> browse_pb2.QueueInfo:
    s = i.summary
    pb = browse_pb2.QueueInfo(
        queue=i.queue, size=s.size, ready=s.ready, delayed=s.delayed, held=s.held,
        configuration=view_config_to_proto(i.config), retry_policy=retry_policy_to_proto(i.retry_policy),
        dead_lettered=i.dead_lettered, approximate=i.approximate,
    )
    for field, age in (("oldest_ready_age", s.oldest_ready_age), ("oldest_mail_age", s.oldest_age)):
        if age is not None:
            getattr(pb, field).CopyFrom(duration_to_proto(age))
    for field, instant in (("browse_start", i.browse_start), ("content_start", i.content_start)):
        if instant is not None:
            getattr(pb, field).CopyFrom(timestamp_to_proto(instant))
    return pb


def view_config_to_proto(c: model.ViewConfig) -> browse_pb2.ViewConfiguration:
    return browse_pb2.ViewConfiguration(
        slice_window=duration_to_proto(c.slice_window),
        bucket_count=c.bucket_count,
        update_browse_start_pace=c.update_browse_start_pace,
    )


def view_config_from_proto(pb: browse_pb2.ViewConfiguration) -> model.ViewConfig:
    return model.ViewConfig(
        slice_window=duration_from_proto(pb.slice_window, "configuration.slice_window", dt.timedelta(days=7)),
        bucket_count=pb.bucket_count,
        update_browse_start_pace=pb.update_browse_start_pace,
    )


_SCHEDULES = {browse_pb2.SCHEDULE_FILTER_READY: "ready", browse_pb2.SCHEDULE_FILTER_DELAYED: "delayed"}


def browse_filter_from_proto(pb: browse_pb2.BrowseRequest, now: dt.datetime) -> filters.BrowseFilter:
    if pb.schedule not in _SCHEDULES and pb.schedule != browse_pb2.SCHEDULE_FILTER_UNSPECIFIED:
        raise InvalidArgument(f"schedule filter {pb.schedule} is unknown: use READY or DELAYED")
    return filters.BrowseFilter(
        sender=pb.sender or None, recipient=pb.recipient or None, name=pb.name or None,
        enqueued_after=timestamp_from_proto(pb.enqueued_after, "enqueued_after") if pb.HasField("enqueued_after") else None,
        enqueued_before=timestamp_from_proto(pb.enqueued_before, "enqueued_before") if pb.HasField("enqueued_before") else None,
        schedule=_SCHEDULES.get(pb.schedule), now=now,
        enqueue_id=validation.enqueue_id(pb.enqueue_id) if pb.enqueue_id else None,
    )


def delete_condition_from_proto(pb: admin_pb2.DeleteMailsRequest) -> filters.BrowseFilter:
    """DeleteMails' one condition (its oneof) as a filter; none: InvalidArgument."""
    kind = pb.WhichOneof("condition")
    if kind == "enqueue_ids":
        return filters.delete_condition(ids=pb.enqueue_ids.ids)
    return filters.delete_condition(**({kind: getattr(pb, kind)} if kind else {}))


def move_filter_from_proto(pb: admin_pb2.MoveMailsRequest, now: dt.datetime) -> filters.BrowseFilter:
    """MoveMails' conditions (AND; none: every live mail) as a filter."""
    f = browse_filter_from_proto(browse_pb2.BrowseRequest(sender=pb.sender, recipient=pb.recipient, name=pb.name,
                                                          schedule=pb.schedule), now)
    return dataclasses.replace(f, enqueue_ids=filters.enqueue_ids(pb.enqueue_ids)) if pb.enqueue_ids else f


def progress_to_proto(p: Any) -> admin_pb2.DeleteProgress:
    """A delete's progress (services/app/admin.py: Progress)."""
    return admin_pb2.DeleteProgress(scanned=p.scanned, deleted=p.deleted, done=p.done)


def reconcile_to_proto(before: counts.Counts, after: counts.Counts) -> admin_pb2.ReconcileCountersResponse:
    return admin_pb2.ReconcileCountersResponse(
        size_before=before.size, delayed_before=before.delayed, held_before=before.held,
        size_after=after.size, delayed_after=after.delayed, held_after=after.held,
    )
