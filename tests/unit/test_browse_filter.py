import datetime as dt
import uuid

import pytest

from services.domain import model
from services.domain.errors import InvalidArgument
from services.domain.filters import MAX_ENQUEUE_IDS, BrowseFilter, delete_condition

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)


def queued(name="n", sender="s@x.org", recipients=("r@y.org",), at=T0):
    return model.QueuedMail("q", uuid.uuid4(), at, model.Mail(name, sender, recipients), (), 0, T0, 0)


def test_empty_filter_matches_all():
    assert BrowseFilter().matches(queued())


def test_each_filter():
    m = queued(recipients=("a@y.org", "b@y.org"))
    assert BrowseFilter(sender="s@x.org").matches(m) and not BrowseFilter(sender="t@x.org").matches(m)
    assert BrowseFilter(recipient="b@y.org").matches(m) and not BrowseFilter(recipient="c@y.org").matches(m)
    assert BrowseFilter(name="n").matches(m) and not BrowseFilter(name="other").matches(m)


def test_a_sender_matches_in_any_case():
    assert BrowseFilter(sender="S@X.Org").matches(queued()) and BrowseFilter(sender="s@x.org").matches(queued(sender="S@x.ORG"))


def test_null_sender_is_spelled_angle_brackets():
    assert BrowseFilter(sender="<>").matches(queued(sender=""))
    assert not BrowseFilter(sender="<>").matches(queued())


def test_time_range_is_half_open():
    m = queued(at=T0)
    assert BrowseFilter(enqueued_after=T0).matches(m)
    assert not BrowseFilter(enqueued_before=T0).matches(m)
    assert BrowseFilter(enqueued_before=T0 + dt.timedelta(milliseconds=1)).matches(m)


def test_filters_combine_with_and():
    f = BrowseFilter(sender="s@x.org", name="other")
    assert not f.matches(queued())


@pytest.mark.parametrize("kwargs", [{}, {"name": "a", "sender": "b"}, {"name": "a", "sender": "b", "recipient": "c"}])
def test_a_delete_condition_is_exactly_one(kwargs):
    args = {"name": None, "sender": None, "recipient": None, **kwargs}
    with pytest.raises(InvalidArgument, match="exactly one condition"):
        delete_condition(**args)


def test_a_delete_condition_matches_like_its_filter():
    f = delete_condition(None, None, "r@y.org")
    assert f.matches(queued()) and not f.matches(queued(recipients=("z@y.org",)))


def test_a_delete_by_enqueue_ids_matches_those_mails_only():
    a, b = queued(name="hi.eml"), queued(name="hi.eml")
    f = delete_condition(ids=[str(a.enqueue_id), str(a.enqueue_id).upper(), str(uuid.uuid4())])
    assert f.enqueue_ids is not None and len(f.enqueue_ids) == 2  # the same id twice counts once
    assert f.matches(a) and not f.matches(b)


@pytest.mark.parametrize("ids,message", [
    ([], "at least one enqueue id"),
    (["not-a-uuid"], "'not-a-uuid' is not a UUID"),
    ([str(uuid.uuid4()), "1234"], "'1234' is not a UUID"),
    ([str(uuid.uuid4()) for _ in range(MAX_ENQUEUE_IDS + 1)], f"exceed the limit of {MAX_ENQUEUE_IDS}"),
])
def test_enqueue_ids_are_uuids_and_at_most_the_limit(ids, message):
    with pytest.raises(InvalidArgument, match=message):
        delete_condition(ids=ids)


def test_ids_and_another_delete_condition_are_two_conditions():
    with pytest.raises(InvalidArgument, match="exactly one condition"):
        delete_condition(name="hi.eml", ids=[str(uuid.uuid4())])
