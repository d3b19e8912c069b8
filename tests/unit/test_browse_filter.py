import datetime as dt
import uuid

import pytest

from services.domain import model
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter, delete_condition

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
