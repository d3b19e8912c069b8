import datetime as dt
import uuid

from services import model, serde
from tests.mails import FULL_MAIL

UTC = dt.timezone.utc

FULL = FULL_MAIL


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
