"""Counter arithmetic (services/domain/counts.py), qshape's table (mailq), the dashboard's metrics."""

import datetime as dt
import json
import pathlib
import re
import uuid

from mailq.queues import shape_table
from services.domain import counts, model

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
H = dt.timedelta(hours=1)


def mail(slice_start, due=None, held=False, size=0) -> model.QueuedMail:
    return model.QueuedMail("q", uuid.uuid4(), slice_start, model.Mail("n", "", ("a@b.c",)), (), size, slice_start, 0,
                            deliver_at=due, held_by=uuid.uuid4() if held else None)


def test_exact_deltas_move_every_counter_to_the_live_mails():
    raw = {"enqueued": {T0: 10, T0 + H: 3}, "gone": {T0: 6, T0 + H: 3}, "delayed": {T0: 2}, "held": {T0: 1},
           "bytes": {T0: 400}}
    live = [mail(T0, size=100), mail(T0, due=T0 + 9 * H, size=200), mail(T0 + H, due=T0 + 9 * H, held=True, size=50)]
    deltas = counts.exact_deltas(raw, live, T0, T0 + 2 * H)
    assert sorted(deltas) == sorted([(T0, "gone", 2), (T0, "delayed", -1), (T0, "held", -1), (T0, "bytes", -100),
                                     (T0 + H, "gone", -1), (T0 + H, "delayed", 1), (T0 + H, "held", 1), (T0 + H, "bytes", 50)])
    healed = {k: dict(v) for k, v in raw.items()}
    for s, kind, delta in deltas:
        healed.setdefault(kind, {})[s] = healed.get(kind, {}).get(s, 0) + delta
    c = counts.summarize(healed, T0)
    assert (c.size, c.delayed, c.held, c.bytes) == (3, 2, 1, 350)


def test_held_is_never_more_than_the_delayed_it_is_part_of():
    # Counters a lost hold left (delayed 1, held 1) on a queue whose mail is gone: nothing is delayed,
    # so nothing is held (GetQueue showed delayed -1, held 1).
    raw = {"enqueued": {T0: 1}, "gone": {T0: 1}, "delayed": {T0: 1}, "held": {T0: 1}}
    c = counts.summarize(raw, T0)
    assert (c.size, c.delayed, c.held) == (0, 0, 0)


def test_slices_before_browse_start_are_ignored():
    raw = {"enqueued": {T0 - H: 7}}
    assert counts.exact_deltas(raw, [], T0, T0) == []
    assert counts.summarize(raw, T0).size == 0


def test_shape_counts_recipients_by_domain_and_geometric_age():
    rows = shape_table(iter([(["a@x.org", "b@Y.org"], 3.0), (["c@x.org"], 50.0), (["d@z.net"], 5000.0)]), top=2)
    assert rows[0] == ["TOTAL", "4", "2", "0", "0", "0", "1", "0", "0", "0", "0", "1"]
    assert rows[1][:3] == ["x.org", "2", "1"] and rows[2][:3] == ["y.org", "1", "1"] and len(rows) == 3


def test_the_dashboard_uses_only_metrics_the_services_export():
    root = pathlib.Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "k8s" / "grafana" / "mailqueue-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(mailqueue_[a-z_]+?)(?:_bucket)?\b[{\[]", e)}
    source = "".join(p.read_text() for p in (root / "services").rglob("*.py"))
    declared = set(re.findall(r'"(mailqueue_[a-z_]+)"', source))
    exported = declared | {f"{m}_total" for m in declared}
    assert used and used <= exported, used - exported


def test_counter_updates_are_gathered_and_written_once_per_key():
    import asyncio

    from services.adapters.cassandra.counter_buffer import CounterBuffer

    class Recorder:  # stands in for the DAO: only what the buffer asks it to write is checked
        def __init__(self) -> None:
            self.writes: list[tuple[str, str, dt.datetime, int]] = []
            self.written = asyncio.Event()

        async def add(self, queue, kind, slice_start, delta) -> None:
            self.writes.append((queue, kind, slice_start, delta))
            self.written.set()

    async def scenario() -> list:
        dao = Recorder()
        buffer = CounterBuffer(dao, flush_s=0.05)
        for _ in range(100):
            await buffer.add("q", "enqueued", T0, 1)
        await buffer.add("q", "gone", T0, 1)
        await buffer.add("q", "gone", T0, -1)  # nets to nothing: not written
        assert dao.writes == []  # gathered, not yet written
        await asyncio.wait_for(dao.written.wait(), 2)  # the flush is due 50 ms after the first update
        return dao.writes

    loop = asyncio.new_event_loop()  # not asyncio.run: it would unset the thread's current loop
    try:
        assert loop.run_until_complete(scenario()) == [("q", "enqueued", T0, 100)]
    finally:
        loop.close()


def test_gone_deltas_check_only_the_slices_a_pass_has_finished():
    raw = {"enqueued": {T0: 5, T0 + H: 4, T0 + 2 * H: 3}, "gone": {T0: 5, T0 + H: 1}}
    live = {T0 + H: 2, T0 + 2 * H: 1}  # T0: every mail gone, none live (no entry)
    # The first two slices read to their end: T0 agrees (0 live), T0+H counts 3 live for 2 found.
    assert counts.gone_deltas(raw, live, T0, T0 + 2 * H) == {T0 + H: 1}
    # The pass at its end: the last slice too (3 counted live, 1 found).
    assert counts.gone_deltas(raw, live, T0 + 2 * H, None) == {T0 + 2 * H: 2}
    # A slice with live mails and no counter at all (its counts lost) gets a negative delta.
    assert counts.gone_deltas({}, {T0: 2}, T0, None) == {T0: -2}


def test_bytes_deltas_make_each_checked_slice_the_size_of_its_live_mails():
    # A mail of 100 bytes counted gone twice (a delete and a SUCCESS of it) in the first slice.
    raw = {"bytes": {T0: 0, T0 + H: 300, T0 + 2 * H: 50}}
    live_bytes = {T0: 100, T0 + H: 300}
    assert counts.bytes_deltas(raw, live_bytes, T0, T0 + 2 * H) == {T0: 100}  # the agreeing slice left out
    assert counts.bytes_deltas(raw, live_bytes, T0 + 2 * H, None) == {T0 + 2 * H: -50}  # no live mail left there
    assert counts.bytes_deltas({}, {}, T0, None) == {}
