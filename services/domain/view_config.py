"""Rules of the view configuration (DESIGN §3), as pure functions.

- ``slice_window`` may only be replaced by a divisor of itself (old slices stay aligned);
- ``bucket_count`` may only grow (old rows stay in buckets that are still read), up to
  ``MAX_BUCKETS``: a listing reads every bucket of a slice, and a count once grown stays;
- ``update_browse_start_pace`` changes freely.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from services.domain.errors import FailedPrecondition, InvalidArgument
from services.domain.model import ViewConfig
from services.domain.slices import is_divisor

#: The most buckets a slice may have: every Browse, size count and browse-start update reads each
#: bucket of a slice, and a bucket count can never be lowered again.
MAX_BUCKETS = 1024

def check_values(c: ViewConfig) -> ViewConfig:
    """A configuration is well-formed on its own."""
    if c.slice_window < dt.timedelta(seconds=1) or c.slice_window % dt.timedelta(seconds=1):
        raise InvalidArgument(f"slice_window must be a whole number of seconds >= 1 s, got {c.slice_window}")
    if not 1 <= c.bucket_count <= MAX_BUCKETS:
        raise InvalidArgument(f"bucket_count must be between 1 and {MAX_BUCKETS}, got {c.bucket_count}")
    if c.update_browse_start_pace < 1:
        raise InvalidArgument(f"update_browse_start_pace must be >= 1, got {c.update_browse_start_pace}")
    return c


def check_change(current: ViewConfig, wanted: ViewConfig) -> None:
    """Raise FailedPrecondition naming the rule that ``current -> wanted`` breaks."""
    check_values(wanted)
    if not is_divisor(wanted.slice_window, current.slice_window):
        raise FailedPrecondition(
            f"rule 'slice_window may only be replaced by a divisor of itself': "
            f"{wanted.slice_window} does not divide {current.slice_window}"
        )
    if wanted.bucket_count < current.bucket_count:
        raise FailedPrecondition(
            f"rule 'bucket_count may only grow': {wanted.bucket_count} < {current.bucket_count}"
        )


def merge(current: ViewConfig, slice_window_s: int | None, bucket_count: int | None, pace: int | None) -> ViewConfig:
    """``current`` with the given fields replaced (None keeps the current value)."""
    return dataclasses.replace(
        current,
        slice_window=dt.timedelta(seconds=slice_window_s) if slice_window_s is not None else current.slice_window,
        bucket_count=bucket_count if bucket_count is not None else current.bucket_count,
        update_browse_start_pace=pace if pace is not None else current.update_browse_start_pace,
    )
