"""Webhook registrations' protobuf <-> domain translation (mailqueue/v1/webhooks.proto)."""

from __future__ import annotations

import datetime as dt

from mailqueue.v1 import webhooks_pb2
from services.contract.events_serde import event_type_from_proto, event_type_to_proto
from services.contract.serde import duration_from_proto, duration_to_proto, timestamp_to_proto
from services.domain import webhook_registry
from services.domain.event_stream import streamed
from services.domain.webhook_registry import Registration


def webhook_from_proto(pb: webhooks_pb2.Webhook) -> Registration:
    """InvalidArgument for an unspecified or unknown event type, or a malformed maximum age."""
    types = tuple(streamed([event_type_from_proto(t) for t in pb.event_types]))
    max_age = 0.0
    if pb.HasField("max_age"):
        duration_from_proto(pb.max_age, "webhook.max_age")  # its range checked
        max_age = pb.max_age.seconds + pb.max_age.nanos / 1e9  # to the nanosecond: 1 ns is no "unset"
    return Registration(pb.name, pb.url, pb.secret_file, types, tuple(pb.queues), max_age, pb.from_oldest)


def webhook_to_proto(r: Registration) -> webhooks_pb2.Webhook:
    pb = webhooks_pb2.Webhook(name=r.name, url=webhook_registry.shown_url(r.url), secret_file=r.secret_file,
                              event_types=[event_type_to_proto(t) for t in r.types], queues=list(r.queues),
                              from_oldest=r.from_oldest)
    pb.max_age.CopyFrom(duration_to_proto(dt.timedelta(seconds=r.max_age_s)))
    if r.created_at is not None:
        pb.created_at.CopyFrom(timestamp_to_proto(r.created_at))
    return pb
