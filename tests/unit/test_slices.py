import datetime as dt

import pytest

from services.domain.slices import bucket_of, is_divisor, slice_start, slices_between

UTC = dt.timezone.utc
HOUR = dt.timedelta(hours=1)


def test_slice_start_is_epoch_aligned():
    instant = dt.datetime(2026, 11, 22, 10, 42, 7, 123000, tzinfo=UTC)
    assert slice_start(instant, HOUR) == dt.datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert slice_start(instant, dt.timedelta(minutes=15)) == dt.datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
    assert slice_start(instant, dt.timedelta(seconds=1)) == dt.datetime(2026, 11, 22, 10, 42, 7, tzinfo=UTC)


def test_an_instant_on_a_boundary_starts_its_own_slice():
    boundary = dt.datetime(2026, 1, 1, 5, tzinfo=UTC)
    assert slice_start(boundary, HOUR) == boundary
    assert slice_start(boundary - dt.timedelta(milliseconds=1), HOUR) == boundary - HOUR


def test_slice_window_must_be_positive():
    with pytest.raises(ValueError):
        slice_start(dt.datetime.now(UTC), dt.timedelta(0))


def test_slices_between_includes_both_ends():
    start = dt.datetime(2026, 1, 1, 1, 30, tzinfo=UTC)
    end = dt.datetime(2026, 1, 1, 4, 10, tzinfo=UTC)
    assert [s.hour for s in slices_between(start, end, HOUR)] == [1, 2, 3, 4]
    assert list(slices_between(end, start, HOUR)) == []


def test_old_slices_stay_aligned_when_the_window_is_divided():
    # Given rows written with a 1 h window, when the window becomes 20 min,
    # then every old slice start is also a slice start of the new window.
    old = [dt.datetime(2026, 1, 1, h, tzinfo=UTC) for h in range(5)]
    new = set(slices_between(old[0], old[-1], dt.timedelta(minutes=20)))
    assert set(old) <= new


def test_bucket_is_stable_and_in_range():
    b = bucket_of("mail-1", "4b0a1c1e-8a8f-4e36-bd37-09a4f8bd1d51", 7)
    assert 0 <= b < 7
    assert b == bucket_of("mail-1", "4b0a1c1e-8a8f-4e36-bd37-09a4f8bd1d51", 7)
    assert bucket_of("anything", "id", 1) == 0


def test_buckets_spread_mails():
    used = {bucket_of(f"m{i}", str(i), 8) for i in range(200)}
    assert used == set(range(8))


def test_bucket_count_must_be_positive():
    with pytest.raises(ValueError):
        bucket_of("m", "id", 0)


@pytest.mark.parametrize(
    "candidate, of, expected",
    [(20, 60, True), (60, 60, True), (25, 60, False), (120, 60, False), (0, 60, False)],
)
def test_is_divisor(candidate, of, expected):
    assert is_divisor(dt.timedelta(minutes=candidate), dt.timedelta(minutes=of)) is expected
