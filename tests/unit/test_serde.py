import datetime as dt
import uuid

from services import model, serde

UTC = dt.timezone.utc

FULL = model.Mail(
    name="mail-1",
    sender="alice@example.com",
    recipients=("bob@example.org", "carol@example.net"),
    state="root",
    error_message="temporary failure",
    remote_host="mx.example.com",
    remote_addr="192.0.2.1",
    last_updated=dt.datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC),
    attributes={"org.apache.james.rrt": '"x"', "count": "3"},
    per_recipient_headers=(
        model.PerRecipientHeaders("bob@example.org", (model.Header("X-A", "1"), model.Header("X-B", "2"))),
        model.PerRecipientHeaders("carol@example.net", (model.Header("X-C", "3"),)),
    ),
)


def test_mail_round_trips_every_field():
    assert serde.mail_from_proto(serde.mail_to_proto(FULL)) == FULL


def test_null_sender_and_absent_fields_round_trip():
    m = model.Mail(name="", sender="", recipients=("a@b.c",))
    back = serde.mail_from_proto(serde.mail_to_proto(m))
    assert back == m and back.last_updated is None


def test_queued_mail_round_trips_through_bytes():
    q = model.QueuedMail(
        queue="spool", enqueue_id=uuid.uuid4(), enqueued_at=dt.datetime(2026, 1, 1, 1, 2, 3, 4000, tzinfo=UTC),
        mail=FULL, blob_ids=("a" * 64, "b" * 64), size=42,
        slice_start=dt.datetime(2026, 1, 1, 1, tzinfo=UTC), bucket=3,
    )
    wire = serde.queued_mail_to_proto(q).SerializeToString()
    from mailqueue.v1 import mail_pb2

    assert serde.queued_mail_from_proto(mail_pb2.QueuedMail.FromString(wire)) == q


def test_view_config_round_trips():
    c = model.ViewConfig(dt.timedelta(minutes=20), 4, 17)
    assert serde.view_config_from_proto(serde.view_config_to_proto(c)) == c
