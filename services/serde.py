"""All protobuf <-> domain translation, as paired to_proto / from_proto functions.

One place to look when a field is lost; tests/unit/test_serde.py round-trips every field.
"""

from __future__ import annotations

import datetime as dt
import uuid

from google.protobuf import duration_pb2, timestamp_pb2

from mailqueue.v1 import browse_pb2, mail_pb2
from services import model


def timestamp_to_proto(value: dt.datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(dt.timezone.utc))
    return ts


def timestamp_from_proto(ts: timestamp_pb2.Timestamp) -> dt.datetime:
    return ts.ToDatetime(tzinfo=dt.timezone.utc)


def duration_to_proto(value: dt.timedelta) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


def duration_from_proto(d: duration_pb2.Duration) -> dt.timedelta:
    return d.ToTimedelta()


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
        last_updated=timestamp_from_proto(pb.last_updated) if pb.HasField("last_updated") else None,
        attributes=dict(pb.attributes),
        per_recipient_headers=tuple(
            model.PerRecipientHeaders(p.recipient, tuple(model.Header(h.name, h.value) for h in p.headers))
            for p in pb.per_recipient_headers
        ),
    )


def queued_mail_to_proto(q: model.QueuedMail) -> mail_pb2.QueuedMail:
    return mail_pb2.QueuedMail(
        queue=q.queue,
        enqueue_id=str(q.enqueue_id),
        enqueued_at=timestamp_to_proto(q.enqueued_at),
        mail=mail_to_proto(q.mail),
        blob_ids=list(q.blob_ids),
        size=q.size,
        slice_start=timestamp_to_proto(q.slice_start),
        bucket=q.bucket,
    )


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
    )


def view_config_to_proto(c: model.ViewConfig) -> browse_pb2.ViewConfiguration:
    return browse_pb2.ViewConfiguration(
        slice_window=duration_to_proto(c.slice_window),
        bucket_count=c.bucket_count,
        update_browse_start_pace=c.update_browse_start_pace,
    )


def view_config_from_proto(pb: browse_pb2.ViewConfiguration) -> model.ViewConfig:
    return model.ViewConfig(
        slice_window=duration_from_proto(pb.slice_window),
        bucket_count=pb.bucket_count,
        update_browse_start_pace=pb.update_browse_start_pace,
    )
