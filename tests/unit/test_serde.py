import dataclasses
import datetime as dt
import uuid

import pytest

from services.contract import serde
from services.domain import model
from services.domain.errors import InvalidArgument
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
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    assert serde.queued_mail_from_bytes(serde.queued_mail_to_bytes(q)) == q


def test_a_broker_message_carries_the_mail_with_its_header_generation():
    from services.adapters.rabbitmq.message_format import RabbitMQMessage as Message

    q = model.QueuedMail(
        queue="spool", enqueue_id=uuid.uuid4(), enqueued_at=dt.datetime(2026, 1, 1, tzinfo=UTC), mail=FULL,
        blob_ids=("a" * 64,), size=1, slice_start=dt.datetime(2026, 1, 1, tzinfo=UTC), bucket=0, generation=5,
    )
    assert Message(1, serde.queued_mail_to_bytes(q), False, None, generation=5).mail() == q
    with pytest.raises(Exception):  # noqa: B017 - whatever protobuf raises: the caller dead-letters it
        Message(2, b"\xff\xff not protobuf", False, None).mail()


def test_view_config_round_trips():
    c = model.ViewConfig(dt.timedelta(minutes=20), 4, 17)
    assert serde.view_config_from_proto(serde.view_config_to_proto(c)) == c


def test_a_scheduled_queued_mail_round_trips_its_schedule_but_not_its_generation():
    q = model.QueuedMail(
        queue="spool", enqueue_id=uuid.uuid4(), enqueued_at=dt.datetime(2026, 1, 1, tzinfo=UTC), mail=FULL,
        blob_ids=("a" * 64,), size=1, slice_start=dt.datetime(2026, 1, 1, tzinfo=UTC), bucket=0,
        deliver_at=dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), attempts=3, last_error="451 later", generation=4,
    )
    back = serde.queued_mail_from_proto(serde.queued_mail_to_proto(q))
    assert back == dataclasses.replace(q, generation=0)  # the generation travels in a broker header


def test_retry_policy_round_trips_and_unset_fields_keep_the_base():
    p = model.RetryPolicy(dt.timedelta(seconds=30), 3.0, dt.timedelta(hours=2), 7, dt.timedelta(days=2))
    assert serde.retry_policy_from_proto(serde.retry_policy_to_proto(p), model.RetryPolicy()) == p
    from mailqueue.v1 import browse_pb2

    assert serde.retry_policy_from_proto(browse_pb2.RetryPolicy(max_attempts=9), p) == dataclasses.replace(p, max_attempts=9)


@pytest.mark.parametrize("seconds,nanos,message", [
    (-62135596800, 0, "t is out of range: use an instant from 1000-01-01"),
    (253402300799, 999999999, "t is out of range"),
    # seconds in range, nanos not: the nanos are named, not the instant's range
    (0, -1, "t is not a valid Timestamp: nanos -1 is outside 0 to 999999999"),
    (1_700_000_000, 10**9, "t is not a valid Timestamp: nanos 1000000000 is outside"),
])
def test_out_of_range_timestamps_are_invalid_argument(seconds, nanos, message):
    from google.protobuf import timestamp_pb2

    with pytest.raises(InvalidArgument, match=message):
        serde.timestamp_from_proto(timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos), "t")


@pytest.mark.parametrize("seconds,nanos,negative,message", [
    (315576000000, 0, False, "out of range"), (5, -1, False, "same sign"), (-5, 0, False, "must not be negative"),
])
def test_bad_durations_are_invalid_argument(seconds, nanos, negative, message):
    from google.protobuf import duration_pb2

    with pytest.raises(InvalidArgument, match=message):
        serde.duration_from_proto(duration_pb2.Duration(seconds=seconds, nanos=nanos), "d", negative=negative)


def test_a_negative_retry_after_means_now():
    from mailqueue.v1 import dequeue_pb2

    o = dequeue_pb2.Outcome()
    assert serde.retry_after_from_proto(o) is None
    o.retry_after.FromTimedelta(dt.timedelta(seconds=-3))
    assert serde.retry_after_from_proto(o) == dt.timedelta(0)
    o.retry_after.FromTimedelta(dt.timedelta(days=-400))  # of any size (it said "at most 31622400 seconds")
    assert serde.retry_after_from_proto(o) == dt.timedelta(0)
    o.retry_after.FromTimedelta(dt.timedelta(days=400))
    with pytest.raises(InvalidArgument, match="retry_after is out of range"):
        serde.retry_after_from_proto(o)


def test_a_message_body_splits_into_the_mail_and_the_content_it_carries():
    from services.adapters.rabbitmq.message_format import split_content

    assert split_content(b"MAILcontent", 7) == (b"MAIL", b"content")
    assert split_content(b"MAIL", 0) == (b"MAIL", b"")
    assert split_content(b"MAIL", None) == (b"MAIL", None)  # a message without content (large mail, older publisher)
    for bad in (-1, 5, "4", True, 4.0):  # a header that does not fit leaves the body whole: poison, dead-lettered
        assert split_content(b"MAIL", bad) == (b"MAIL", None)


def test_each_delete_condition_from_proto():
    from mailqueue.v1 import admin_pb2

    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    by_ids = serde.delete_condition_from_proto(admin_pb2.DeleteMailsRequest(queue="q", enqueue_ids=admin_pb2.EnqueueIds(ids=ids)))
    assert by_ids.enqueue_ids == {uuid.UUID(i) for i in ids} and by_ids.name is None
    for empty in ({"name": ""}, {"sender": " "}, {"recipient": ""}):  # set, though empty: an unset variable
        with pytest.raises(InvalidArgument, match="condition is empty"):
            serde.delete_condition_from_proto(admin_pb2.DeleteMailsRequest(queue="q", **empty))
    assert serde.delete_condition_from_proto(admin_pb2.DeleteMailsRequest(queue="q", sender="<>")).sender == "<>"
    with pytest.raises(InvalidArgument, match="exactly one condition"):
        serde.delete_condition_from_proto(admin_pb2.DeleteMailsRequest(queue="q"))
    with pytest.raises(InvalidArgument, match="at least one enqueue id"):
        serde.delete_condition_from_proto(admin_pb2.DeleteMailsRequest(queue="q", enqueue_ids=admin_pb2.EnqueueIds()))


def test_a_move_filter_from_proto_combines_ids_with_the_other_conditions():
    from mailqueue.v1 import admin_pb2, browse_pb2

    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    one = str(uuid.uuid4())
    f = serde.move_filter_from_proto(admin_pb2.MoveMailsRequest(queue="q", to_queue="t", name="n", enqueue_ids=[one],
                                                                schedule=browse_pb2.SCHEDULE_FILTER_READY), now)
    assert (f.enqueue_ids, f.name, f.schedule, f.now) == ({uuid.UUID(one)}, "n", "ready", now)
    assert serde.move_filter_from_proto(admin_pb2.MoveMailsRequest(queue="q", to_queue="t"), now).enqueue_ids is None
    with pytest.raises(InvalidArgument, match="is not a UUID"):
        serde.move_filter_from_proto(admin_pb2.MoveMailsRequest(queue="q", to_queue="t", enqueue_ids=[one, "x"]), now)


@pytest.mark.parametrize("instant", [
    dt.datetime(2026, 11, 29, 2, 41, 9, 123456, tzinfo=dt.timezone.utc),
    dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=dt.timezone.utc),  # before the epoch: nanos stay positive
    dt.datetime(1000, 1, 1, tzinfo=dt.timezone.utc),
    dt.datetime(2026, 11, 29, 7, 41, 9, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
])
def test_an_instant_becomes_the_timestamp_protobuf_itself_makes(instant):
    from google.protobuf import timestamp_pb2

    from services.contract.serde import timestamp_to_proto

    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(instant.astimezone(dt.timezone.utc))
    assert timestamp_to_proto(instant) == expected
    assert timestamp_to_proto(instant).ToDatetime(tzinfo=dt.timezone.utc) == instant


def test_a_negative_delay_of_any_size_means_now_and_a_malformed_one_is_refused():
    from google.protobuf import duration_pb2

    from mailqueue.v1 import enqueue_pb2

    for seconds in (-1, -40_000_000, -315_576_000_000):  # the proto: "a negative delay: now"
        r = enqueue_pb2.EnqueueRequest(delay=duration_pb2.Duration(seconds=seconds))
        assert serde.schedule_from_proto(r) == (None, dt.timedelta(0))
    with pytest.raises(InvalidArgument):
        serde.schedule_from_proto(enqueue_pb2.EnqueueRequest(delay=duration_pb2.Duration(seconds=-1, nanos=5)))
