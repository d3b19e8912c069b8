"""The ages GetQueue, ``mailq show`` and the gauge report: the oldest mail's and the oldest
deliverable mail's, exact to the read (services/domain/ages.py), not rounded to the slice window.

They come from a head scan: the queue's first live mails in enqueue order, read as a first
Browse page is (a page per bucket, the marks of the rows handed out), stopping as soon as the ages
cannot change. Where to begin:

- The counters (read for the sizes anyway) name the oldest slice with a live mail: the scan
  begins there, and reads nothing when they count no live mail (they lag a second).
- Each browse_svc replica remembers, per queue, where the last scan found the oldest live mail
  (its cursor): every mail before it was gone then, and a gone mail stays gone, so the next scan
  reads on from there and does not read again the rows of every mail delivered since the slice
  began. Rows that may still land behind the cursor: an enqueue in flight (its enqueue time is
  taken before its row is written), a node whose clock lags, a moved or redriven mail (it keeps
  its enqueue time, in the current slice). So the scan never begins later than ``REWIND`` before
  now, and every ``RESCAN_S`` it begins again at the counters' oldest live slice.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from services.domain import ages, counts, model, paging
from services.domain.slices import slice_ms, slice_start

#: A scan begins no later than this before now: an enqueue takes its instant just before it
#: writes its row (after the content), so a row lands behind its instant by the write's latency;
#: clocks of the enqueue nodes may lag a little.
REWIND = dt.timedelta(seconds=10)
#: Seconds after which a queue's scan begins again at its oldest live slice (moved mails).
RESCAN_S = 300.0
#: Rows asked of each bucket at first (doubling as the scan reads on): the scan mostly stops at
#: the first live mail.
FIRST_PAGE = 10
#: The largest id: "after (t - 1 ms, this)" is "from instant t on" (Cassandra orders uuids of
#: version 4 below it, and so does Position).
_LAST_ID = b"\xff" * 16

LiveMails = Callable[..., AsyncIterator[model.QueuedMail]]


def from_instant(partition: dt.datetime, instant: dt.datetime) -> paging.Position:
    """The position just before every row of ``partition`` enqueued at ``instant`` or later."""
    return paging.Position(slice_ms(partition), instant - dt.timedelta(milliseconds=1), _LAST_ID)


class HeadAges:
    def __init__(self, live_mails: LiveMails, clock: Callable[[], float] = time.monotonic) -> None:
        self._live_mails = live_mails
        self._clock = clock
        #: queue -> (the position just before its oldest live mail at the last scan, when it began
        #: at the oldest live slice).
        self._cursors: dict[str, tuple[paging.Position, float]] = {}

    async def scan(self, queue: str, counted: counts.Counts, window: dt.timedelta) -> ages.HeadScan:
        """The head scan of ``queue``, given its counters (``window``: the slice window)."""
        now = model.utcnow()
        scan = ages.HeadScan(now)
        if counted.oldest_slice is None:
            self._cursors.pop(queue, None)
            scan.end()
            return scan
        since, after, anchored = counted.oldest_slice, None, self._clock()
        cursor = self._cursors.get(queue)
        if cursor is not None and self._clock() - cursor[1] < RESCAN_S:
            rewind = now - REWIND
            after = min(cursor[0], from_instant(slice_start(rewind, window), rewind))
            if after.partition < slice_ms(since):
                after = None  # the counters count no live mail before ``since``
            anchored = cursor[1]
        mails = self._live_mails(queue, "age", first_page=FIRST_PAGE, after=after, since=since)
        async with aclosing(mails):  # type: ignore[type-var]
            async for q in mails:
                if scan.add(q):
                    break
            else:
                scan.end()
        if scan.oldest is not None:
            self._cursors[queue] = (from_instant(scan.oldest.slice_start, scan.oldest.enqueued_at), anchored)
        return scan

def summary(c: counts.Counts, scan: ages.HeadScan) -> model.Summary:
    """The counters' sizes with the head scan's ages."""
    return model.Summary(size=c.size, ready=c.ready, delayed=c.delayed - c.held, held=c.held,
                         oldest_age=scan.oldest_age, oldest_ready_age=scan.oldest_ready_age)
