"""The retention sweep's rules (DESIGN §4 "Retention sweep"), as pure functions.

The sweep itself (spark/sweep.py) reads and deletes at scale; what it may delete is decided here:

- A queue's slices strictly before ``browse_start - grace`` may be dropped, but never past the
  first slice that still holds a live (unmarked) mail: such a slice, and every later one, is kept
  and reported. The slices dropped are exactly those before the new content start.
- Content start is advanced **before** any row or mark is deleted. Dequeue treats a mail whose
  slice is before content start as gone, so no instant exists at which a swept mail has lost
  its deleted mark but still looks live (a ghost delivery). A crash after the advance leaves
  rows and marks behind content start; the next run deletes them without asking again.
- Marks go before rows (both are behind content start by then, so the order is free): a crash
  between the two leaves rows whose marks are gone, which the next run finds and deletes; it
  never leaves marks without rows. A mark whose row never landed (an enqueue that failed) is an
  orphan, collected by ``--orphan-marks`` (a full scan of the marks table, for a weekly run).
- A blob is collected only when no remaining row references it and it was last written
  before ``sweep start - blob grace``. Enqueue refreshes the modification time of a blob it
  deduplicates onto, so a blob about to be referenced again is always young.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from services.domain import slices


@dataclasses.dataclass(frozen=True)
class QueuePlan:
    """What the sweep may do to one queue."""

    queue: str
    content_start: dt.datetime | None
    #: Slices strictly before this one are past ``browse_start - grace``.
    drop_before: dt.datetime


def drop_before(browse_start: dt.datetime, grace: dt.timedelta, window: dt.timedelta) -> dt.datetime:
    """The first slice the sweep must keep: the slice holding ``browse_start - grace``.

    A slice [s, s + window) is strictly before the cutoff when s + window <= cutoff, i.e. when
    s is before the slice holding the cutoff.
    """
    if grace < dt.timedelta(0):
        raise ValueError(f"grace must not be negative, got {grace}")
    return slices.slice_start(browse_start - grace, window)


def plan(queue: str, browse_start: dt.datetime | None, content_start: dt.datetime | None,
         grace: dt.timedelta, window: dt.timedelta) -> QueuePlan | None:
    """The queue's plan, or None when it has no browse start (nothing is known dead)."""
    if browse_start is None:
        return None
    return QueuePlan(queue, content_start, drop_before(browse_start, grace, window))


def new_content_start(p: QueuePlan, earliest_live_slice: dt.datetime | None) -> dt.datetime:
    """Where content start moves: up to ``drop_before``, stopping at the first live mail's slice.

    Never backwards: rows before the current content start are already gone by definition.
    """
    target = p.drop_before
    if earliest_live_slice is not None and earliest_live_slice < target:
        target = earliest_live_slice
    if p.content_start is not None and p.content_start > target:
        return p.content_start
    return target


def blob_collectable(last_modified: dt.datetime, sweep_started: dt.datetime, blob_grace: dt.timedelta) -> bool:
    """True when an unreferenced blob is old enough to delete."""
    return last_modified < sweep_started - blob_grace


@dataclasses.dataclass
class Summary:
    """What one run did (or, with dry_run, would do). Printed and written as JSON."""

    dry_run: bool
    queues: int = 0
    slices: int = 0
    partitions: int = 0
    rows: int = 0
    marks: int = 0
    orphan_marks: int = 0
    blobs: int = 0
    bytes_reclaimed: int = 0
    #: SWEPT events written to the mail history (one per row deleted; 0 with MAILQUEUE_EVENTS=off).
    events: int = 0
    live_slices_held: list[dict[str, str]] = dataclasses.field(default_factory=list)
    content_starts: dict[str, str] = dataclasses.field(default_factory=dict)
    duration_s: float = 0.0

    def lines(self) -> list[str]:
        verb = "would delete" if self.dry_run else "deleted"
        out = [
            f"retention sweep{' (dry run: nothing changed)' if self.dry_run else ''}: {self.queues} queues, {self.duration_s:.1f} s",
            f"  slices    {verb} {self.slices} ({self.partitions} partitions, {self.rows} rows)",
            f"  marks     {verb} {self.marks} (of which {self.orphan_marks} orphans)",
            f"  blobs     {verb} {self.blobs} ({self.bytes_reclaimed} bytes reclaimed)",
            f"  events    {'would record' if self.dry_run else 'recorded'} {self.events} swept (mail history)",
        ]
        for queue, start in sorted(self.content_starts.items()):
            out.append(f"  queue {queue}: content start {'would be' if self.dry_run else 'is'} {start}")
        for held in self.live_slices_held:
            out.append(
                f"  queue {held['queue']}: slice {held['slice_start']} is before browse start - grace but holds "
                "a live mail; it and later slices were kept (run UpdateBrowseStart, or delete the mail)"
            )
        return out
