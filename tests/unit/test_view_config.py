import datetime as dt

import pytest

from services.domain.errors import FailedPrecondition, InvalidArgument
from services.domain.model import ViewConfig
from services.domain.view_config import check_change, check_values, merge

H = dt.timedelta(hours=1)


def test_defaults_are_those_of_the_design():
    c = ViewConfig()
    assert (c.slice_window, c.bucket_count, c.update_browse_start_pace) == (H, 1, 1000)


def test_slice_window_may_be_replaced_by_a_divisor():
    check_change(ViewConfig(H, 1, 1000), ViewConfig(dt.timedelta(minutes=30), 1, 1000))


def test_slice_window_may_not_grow_or_change_to_a_non_divisor():
    with pytest.raises(FailedPrecondition, match="divisor"):
        check_change(ViewConfig(H, 1, 1000), ViewConfig(2 * H, 1, 1000))
    with pytest.raises(FailedPrecondition, match="divisor"):
        check_change(ViewConfig(H, 1, 1000), ViewConfig(dt.timedelta(minutes=7), 1, 1000))


def test_bucket_count_may_only_grow():
    check_change(ViewConfig(H, 2, 1000), ViewConfig(H, 3, 1000))
    with pytest.raises(FailedPrecondition, match="bucket_count may only grow"):
        check_change(ViewConfig(H, 3, 1000), ViewConfig(H, 2, 1000))


def test_pace_changes_freely():
    check_change(ViewConfig(H, 1, 1000), ViewConfig(H, 1, 1))
    check_change(ViewConfig(H, 1, 1), ViewConfig(H, 1, 50000))


@pytest.mark.parametrize(
    "config",
    [
        ViewConfig(dt.timedelta(0), 1, 1),
        ViewConfig(dt.timedelta(milliseconds=1500), 1, 1),
        ViewConfig(H, 0, 1),
        ViewConfig(H, 1, 0),
    ],
)
def test_malformed_configurations_are_invalid(config):
    with pytest.raises(InvalidArgument):
        check_values(config)


def test_merge_keeps_unset_fields():
    c = merge(ViewConfig(H, 2, 10), None, 4, None)
    assert c == ViewConfig(H, 4, 10)
    assert merge(c, 60, None, 5) == ViewConfig(dt.timedelta(minutes=1), 4, 5)


@pytest.mark.parametrize("count", [0, 1025, 2**31 - 1])
def test_a_bucket_count_is_between_1_and_1024(count):
    with pytest.raises(InvalidArgument, match="between 1 and 1024"):
        check_values(ViewConfig(bucket_count=count))
    check_values(ViewConfig(bucket_count=1024))
