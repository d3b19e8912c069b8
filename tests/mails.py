"""A mail with every field set, shared by the serde round trip and the enqueue tests."""

import datetime as dt

from services.domain import model

FULL_MAIL = model.Mail(
    name="mail-full",
    sender="alice@example.com",
    recipients=("bob@example.org", "carol@example.net"),
    state="root",
    error_message="421 try later",
    remote_host="mx.example.com",
    remote_addr="192.0.2.7",
    last_updated=dt.datetime(2026, 11, 1, 12, 0, 0, 250000, tzinfo=dt.timezone.utc),
    attributes={"org.apache.james.priority": "5", "json": '{"a": [1, 2]}'},
    per_recipient_headers=(
        model.PerRecipientHeaders("bob@example.org", (model.Header("X-A", "1"), model.Header("X-B", "two"))),
        model.PerRecipientHeaders("carol@example.net", (model.Header("X-C", "3"),)),
    ),
)
