"""The sweep's rules (services/domain/retention.py): what may be dropped, where content start moves."""

import datetime as dt

import pytest

from services.domain import retention
from services.domain.durations import parse_duration
from services.domain.errors import InvalidArgument

T = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)


def test_slices_strictly_before_browse_start_minus_grace_are_dropped():
    # browse start 10:00, grace 1 h: the 09:00 slice ends at the cutoff and is dropped; 09:00 is kept first.
    assert retention.drop_before(T, HOUR, HOUR) == T - HOUR
    # A cutoff inside a slice keeps that slice (it is not strictly before the cutoff).
    assert retention.drop_before(T, dt.timedelta(minutes=30), HOUR) == T - HOUR
    assert retention.drop_before(T, dt.timedelta(0), HOUR) == T


def test_negative_grace_is_refused():
    with pytest.raises(ValueError, match="grace"):
        retention.drop_before(T, dt.timedelta(seconds=-1), HOUR)


def test_no_browse_start_means_no_plan():
    assert retention.plan("q", None, None, HOUR, HOUR) is None


def test_content_start_stops_at_the_first_live_mail():
    p = retention.plan("q", T, T - 5 * HOUR, dt.timedelta(0), HOUR)
    assert retention.new_content_start(p, None) == T
    assert retention.new_content_start(p, T - 3 * HOUR) == T - 3 * HOUR
    assert retention.new_content_start(p, T + HOUR) == T  # a live mail after the cutoff changes nothing


def test_content_start_never_moves_back():
    p = retention.plan("q", T, T + HOUR, dt.timedelta(0), HOUR)  # an earlier run went further
    assert retention.new_content_start(p, T - 3 * HOUR) == T + HOUR
    assert retention.new_content_start(retention.plan("q", T, None, HOUR, HOUR), None) == T - HOUR


def test_only_old_blobs_are_collectable():
    started = T
    assert retention.blob_collectable(T - 2 * HOUR, started, HOUR)
    assert not retention.blob_collectable(T - HOUR, started, HOUR)
    assert not retention.blob_collectable(T, started, dt.timedelta(0))


def test_summary_says_what_a_dry_run_would_do_and_names_held_slices():
    s = retention.Summary(dry_run=True, queues=1, slices=2, partitions=2, rows=10, marks=10, blobs=3, bytes_reclaimed=99)
    s.live_slices_held.append({"queue": "q", "slice_start": T.isoformat()})
    text = "\n".join(s.lines())
    assert "dry run: nothing changed" in text and "would delete 2 (2 partitions, 10 rows)" in text
    assert "holds a live mail" in text and "UpdateBrowseStart" in text


@pytest.mark.parametrize("text,seconds", [("0s", 0), ("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800)])
def test_durations(text, seconds):
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


def test_bad_duration_says_how_to_write_one():

    with pytest.raises(InvalidArgument, match="e.g. 90s"):
        parse_duration("1 hour")


def test_a_duration_is_at_most_100_years():
    from services.domain.durations import parse_duration

    assert parse_duration("36500d").days == 36500
    with pytest.raises(InvalidArgument, match="longer than 36500d"):
        parse_duration("36501d")
