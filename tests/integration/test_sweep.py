"""The retention sweep (#6) against the real Cassandra and MinIO, Spark in local mode.

Each run is the real command line (``python -m spark.sweep``) in a subprocess, on a keyspace and
a bucket of this module's own, with 1-second slices. A run costs 20-30 s (JVM, connector, some
thirty small Spark jobs), so the queues of five tests are seeded together and swept by shared runs
(the ``swept`` and ``reswept`` fixtures), each test asserting its own queue's state after them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import queue as queue_mod
import subprocess
import sys
import threading
import time
import uuid

import grpc
import pika
import pytest

from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, events_pb2, events_pb2_grpc
from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.domain import model, slices
from stack.harness import ROOT, drop_queues, new_keyspace, wait_until
from tests.conftest import CREATED_QUEUES, Suite
from tests.integration.helpers import (
    StreamConsumer,
    inline,
    message_count,
    simple_mail,
)
from tests.integration.test_browse_admin import next_slice

#: The first test also sets up the shared sweep runs (three Spark runs: 217 s on a quiet 2-core
#: machine, over 300 s beside other work); each test's bound is 600 s (each run has its own 300 s).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def sweep_suite(aio_loop, running_stack) -> Suite:
    s = Suite(
        aio_loop, new_keyspace(), MAILQUEUE_SLICE_WINDOW_S="1", MAILQUEUE_BROWSE_START_PACE="1000000",
        MAILQUEUE_S3_BUCKET=f"mq-sweep-{uuid.uuid4().hex[:8]}", MAILQUEUE_S3_TOUCH_INTERVAL_S="0",
        MAILQUEUE_QUEUE_CACHE_S="1",  # DeleteQueue waits out the queue caches: 1 s, not 10
    )
    yield s
    s.stop(drop=True)


def sweep(s: Suite, *args: str, failpoint: str = "", expect: int = 0, **env: str) -> dict:
    """Run the sweep's command line; return its JSON summary."""
    summary = os.path.join(ROOT, ".stack", f"sweep-{uuid.uuid4().hex[:8]}.json")
    # The quick-start JVM options: each run here is small, and starting is most of its time.
    run_env = dict(s.env, MAILQUEUE_SWEEP_FAILPOINT=failpoint, MAILQUEUE_SPARK_JAVA_OPTIONS="quick", **env)
    p = subprocess.run(
        [sys.executable, "-m", "spark.sweep", "--master", "local[2]", "--grace", "0s", "--blob-grace", "0s",
         "--summary-file", summary, *args],
        cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == expect, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-3000:]}"
    if expect != 0:
        return {"stdout": p.stdout, "stderr": p.stderr}
    with open(summary, encoding="utf-8") as f:
        result = json.load(f)
    os.unlink(summary)
    assert "retention sweep" in p.stdout
    not_json = [line for line in p.stderr.splitlines() if not _is_json(line)]
    assert not not_json, f"log lines that are not JSON (Spark's included, see spark/log4j2.properties): {not_json[:5]}"
    return result


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def blob_exists(s: Suite, blob_id: str) -> bool:
    try:
        s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=blob_id))
        return True
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND
        return False


#: Over MAILQUEUE_SMALL_BLOB_BYTES (64 KiB): such content is an S3 object.
LARGE = 70_000


def in_small_table(s: Suite, blob_id: str) -> bool:
    rows = s.run(execute(s.view.session, f"SELECT size FROM {s.keyspace}.{schema.BLOBS} WHERE blob_id = %s", (blob_id,)))
    return bool(rows)


def advance_browse_start(s: Suite, queue: str) -> dt.datetime:
    next_slice()
    next_slice()
    return s.admin_stub.UpdateBrowseStart(admin_pb2.UpdateBrowseStartRequest(queue=queue)).browse_start.ToDatetime(
        tzinfo=dt.timezone.utc
    )


def rows_before(s: Suite, queue: str, start: dt.datetime, end: dt.datetime) -> list[model.QueuedMail]:
    """Every row still stored in the queue's slices in [start, end)."""

    async def read():
        config = await s.view.config.current()
        out = []
        for sl in slices.slices_between(start, end - config.slice_window, config.slice_window):
            for b in range(config.bucket_count):
                out += await s.view.enqueued.read_slice(queue, sl, b)
        return out

    return s.run(read())


def mark(s: Suite, queue: str, enqueue_id: str) -> str | None:
    return s.run(s.view.mails.reason(queue, uuid.UUID(enqueue_id)))


def content_start(s: Suite, queue: str) -> dt.datetime:
    info = s.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info
    return info.content_start.ToDatetime(tzinfo=dt.timezone.utc)


def drain(s: Suite, queue: str, n: int) -> dict[str, bytes]:
    """Dequeue n mails with SUCCESS; name -> content."""
    c = StreamConsumer(s.dequeue_stub, queue)
    got = {}
    for _ in range(n):
        d = c.next()
        got[d.mail.mail.name] = d.content
        c.answer(d)
    c.close()
    return got


def history(s: Suite, queue: str, dead: int, content=None) -> list:
    """``dead`` mails over two slices, all dequeued; their receipts. ``content(i)`` by default is
    unique per mail."""
    receipts = []
    for i in range(dead):
        if i == dead // 2:
            next_slice()
        receipts.append(s.enqueue_mail(queue, f"dead-{i}", content(i) if content else f"dead {i} {uuid.uuid4()}".encode()))
    assert len(drain(s, queue, dead)) == dead
    return receipts


def dead_blob_ids(receipts) -> list[str]:
    return [r.blob_ids[0] for r in receipts]


class Seeded:
    """One queue the shared sweeps act on: the mails whose rows they should drop (``dead``), the
    blobs that should go with them, the blobs that must stay, and the window its rows are read in."""

    def __init__(self, name: str, began: dt.datetime) -> None:
        self.name, self.began = name, began
        self.dead: list[str] = []  # enqueue ids
        self.gone_blobs: list[str] = []  # distinct blobs no other row or dead letter references
        self.kept_blobs: list[str] = []
        self.end: dt.datetime | None = None  # rows in [began, end) are the dead ones
        self.browse_start: dt.datetime | None = None

    def rows(self, s: Suite) -> int:
        return len(rows_before(s, self.name, self.began, self.end))

    def marks(self, s: Suite) -> list[str | None]:
        return [mark(s, self.name, e) for e in self.dead]

    def blobs(self, s: Suite) -> tuple[list[bool], list[bool]]:
        return [blob_exists(s, b) for b in self.gone_blobs], [blob_exists(s, b) for b in self.kept_blobs]


class Shared:
    """The queues of four tests, seeded once and swept together (a sweep run costs 20-30 s): a dry
    run and a real run of every queue (``--queue`` not given), each queue's state read after each."""

    def __init__(self) -> None:
        self.queues: dict[str, Seeded] = {}
        self.planned: dict = {}
        self.done: dict = {}
        # Per queue: its state before the dry run, after it, and after the sweep.
        self.before: dict[str, dict] = {}
        self.after_dry_run: dict[str, dict] = {}
        self.after: dict[str, dict] = {}
        self.extra: dict = {}

    def state(self, s: Suite, key: str) -> dict:
        q = self.queues[key]
        out = {"rows": q.rows(s), "marks": q.marks(s), "blobs": q.blobs(s)}
        if key != "deleted":  # a dropped queue has no GetQueue
            out["content_start"] = content_start(s, q.name)
        return out


@pytest.fixture(scope="module")
def swept(sweep_suite) -> Shared:
    s, sh = sweep_suite, Shared()
    began = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    q = {k: Seeded(s.new_queue(), began) for k in ("main", "stale", "deleted", "delayed", "dead_letters", "orphan")}
    sh.queues = q
    # These queues outlive the test that first asks for them: not dropped after it (conftest's
    # _drop_created_queues) but after the module's tests.
    names = [sq.name for sq in q.values()]
    CREATED_QUEUES[:] = [n for n in CREATED_QUEUES if n not in names]

    # main: eight dead mails over two slices; two contents over 64 KiB live in S3, the others in
    # the small-blob table: both are collected. The last dead content is shared with a live mail.
    shared = f"shared content {uuid.uuid4()}".encode()
    dead = history(s, q["main"].name, 8, lambda i: shared if i == 7 else (
        os.urandom(LARGE) if i in (1, 4) else f"dead {i} {uuid.uuid4()}".encode()))
    q["main"].dead = [r.enqueue_id for r in dead]
    q["main"].gone_blobs, q["main"].kept_blobs = dead_blob_ids(dead)[:7], dead_blob_ids(dead)[7:]
    sh.extra["main_in_small_table"] = [in_small_table(s, b) for b in dead_blob_ids(dead)]

    # stale: mails deleted by an operator; their RabbitMQ messages stay queued.
    stale = [s.enqueue_stub.Enqueue(inline(q["stale"].name, simple_mail(n), b"Subject: x\r\n\r\nbody")).receipt
             for n in ("x1", "x2", "x3")]
    q["stale"].dead, q["stale"].gone_blobs = [r.enqueue_id for r in stale], sorted({r.blob_ids[0] for r in stale})
    sh.extra["stale_cleared"] = sum(
        p.progress.deleted for p in s.admin_stub.ClearQueue(admin_pb2.ClearQueueRequest(queue=q["stale"].name)))

    # deleted: DeleteQueue leaves the content to the sweep, the dropped queue stays in its list.
    dropped = [s.enqueue_mail(q["deleted"].name, f"m{i}", f"dropped {i} {uuid.uuid4()}".encode()) for i in range(3)]
    q["deleted"].dead, q["deleted"].gone_blobs = [r.enqueue_id for r in dropped], dead_blob_ids(dropped)
    # Their slice a window old by the delete's end, so its browse start moves past them then (no
    # healer runs here to move it later).
    next_slice()
    next_slice()
    sh.extra["deleted_progress"] = list(s.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=q["deleted"].name, force=True)))
    sh.extra["deleted_listed"] = q["deleted"].name in s.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues
    q["deleted"].end = dt.datetime.now(dt.timezone.utc)

    # delayed: a dead history, then a delayed mail and a retried one (its schedule row has no deleted_at).
    old = history(s, q["delayed"].name, 4)
    q["delayed"].dead, q["delayed"].gone_blobs = [r.enqueue_id for r in old], dead_blob_ids(old)
    next_slice()
    q["delayed"].end = dt.datetime.now(dt.timezone.utc)
    delayed = inline(q["delayed"].name, simple_mail("delayed"), b"delayed content")
    delayed.delay.FromTimedelta(dt.timedelta(hours=1))
    s.enqueue_stub.Enqueue(delayed)
    s.enqueue_mail(q["delayed"].name, "retried", b"retried content")
    c = StreamConsumer(s.dequeue_stub, q["delayed"].name)
    first = c.next()
    sh.extra["delayed_first"] = first.mail.mail.name
    c.answer(first, "RETRY", "451 later", retry_after=3600)
    wait_until(lambda: [r.mail.attempts for r in s.browse_stub.Browse(
        browse_pb2.BrowseRequest(queue=q["delayed"].name, name="retried"))] == [1], what="the retry recorded")
    c.close()

    # dead_letters: two mails rejected (one small, one an S3 object): rows swept, content kept.
    dl = q["dead_letters"]
    small = s.enqueue_mail(dl.name, "small", f"small {uuid.uuid4()}".encode())
    sh.extra["large_content"] = os.urandom(LARGE)
    large = s.enqueue_mail(dl.name, "large", sh.extra["large_content"])
    dl.dead, dl.kept_blobs = [small.enqueue_id, large.enqueue_id], [small.blob_ids[0], large.blob_ids[0]]
    c = StreamConsumer(s.dequeue_stub, dl.name)
    for d in c.take(2):
        c.answer(d, "REJECT", "550 no such user")
    c.close()
    wait_until(lambda: dead_letter_names(s, dl.name) == ["large", "small"], 30, what="both mails dead letters")
    sh.extra["large_in_s3"] = not in_small_table(s, large.blob_ids[0])

    # orphan: a live mail; its orphan marks are written once its browse start is known.
    s.enqueue_mail(q["orphan"].name, "live", b"x")

    # main's live mails, one with the shared content.
    next_slice()
    sh.extra["live"] = {f"live-{i}": (shared if i == 0 else f"live content {i}".encode()) for i in range(3)}
    for name, content in sh.extra["live"].items():
        s.enqueue_mail(q["main"].name, name, content)

    next_slice()
    next_slice()
    for key, sq in q.items():
        if key != "deleted":
            sq.browse_start = s.admin_stub.UpdateBrowseStart(
                admin_pb2.UpdateBrowseStartRequest(queue=sq.name)).browse_start.ToDatetime(tzinfo=dt.timezone.utc)
            sq.end = sq.end or sq.browse_start
    # A mark whose row never landed (an enqueue that failed long ago), and one written just now.
    sh.extra["orphan_old"], sh.extra["orphan_recent"] = uuid.uuid4(), uuid.uuid4()
    insert = (f"INSERT INTO {s.keyspace}.deleted_mails_v1 (queue_name, enqueue_id, reason, deleted_at) "
              "VALUES (%s, %s, 'enqueue failed', %s)")
    s.view.session.execute(insert, (q["orphan"].name, sh.extra["orphan_old"], q["orphan"].browse_start - dt.timedelta(minutes=5)))
    s.view.session.execute(insert, (q["orphan"].name, sh.extra["orphan_recent"], dt.datetime.now(dt.timezone.utc)))

    # A move under way, as a browse_svc killed mid-move leaves it: its journal entry holds the only
    # reference to its content (one blob in the small-blob table, one in S3).
    journaled = [s.blob_stub.PutBytes(blob_pb2.PutBytesRequest(content=c)).blob_id
                 for c in (f"moving {uuid.uuid4()}".encode(), os.urandom(LARGE))]
    moving = model.QueuedMail(q["main"].name, uuid.uuid4(), dt.datetime.now(dt.timezone.utc), model.Mail("moving", "a@b.c", ("d@e.f",)),
                              tuple(journaled), 1, q["main"].began, 0)
    s.loop.run(s.view.moves.begin(moving, dataclasses.replace(moving, queue=q["orphan"].name, enqueue_id=uuid.uuid4())))
    sh.extra["journaled"], sh.extra["moving"] = journaled, moving

    sh.before = {k: sh.state(s, k) for k in q}
    sh.planned = sweep(s, "--dry-run")  # every queue: the dropped one is read from dropped_queues_v1
    sh.after_dry_run = {k: sh.state(s, k) for k in q}
    sh.done = sweep(s)
    sh.after = {k: sh.state(s, k) for k in q}
    sh.extra["orphan_marks_after"] = (mark(s, q["orphan"].name, str(sh.extra["orphan_old"])),
                                      mark(s, q["orphan"].name, str(sh.extra["orphan_recent"])))
    sh.extra["journaled_kept"] = [blob_exists(s, b) for b in journaled]
    s.loop.run(s.view.moves.done(moving))
    yield sh
    try:
        drop_queues(names)
    except pika.exceptions.AMQPError:
        pass  # as conftest's _drop_created_queues


@pytest.fixture(scope="module")
def reswept(sweep_suite, swept) -> dict:
    """A second run after the complete one, on the queues that had nothing new (main, stale,
    delayed), the orphan one, looking for orphan marks this time, and dead_letters after its
    dead letters were dealt with: the large one redriven and delivered, then both purged (one
    Spark run for what two would otherwise check: a run costs 20-30 s)."""
    s, sh = sweep_suite, swept
    q = sh.queues
    dl = q["dead_letters"]
    sh.extra["dl_redriven"] = list(s.admin_stub.RedriveDeadLetters(admin_pb2.RedriveDeadLettersRequest(
        queue=dl.name, filter=browse_pb2.DeadLetterFilter(name="large"))))[-1].redriven
    sh.extra["dl_delivered"] = drain(s, dl.name, 1)
    sh.extra["dl_purged"] = list(s.admin_stub.PurgeDeadLetters(admin_pb2.PurgeDeadLettersRequest(queue=dl.name, all=True)))[-1].purged
    sh.extra["dl_left"] = dead_letter_names(s, dl.name)
    advance_browse_start(s, dl.name)
    return sweep(s, *(a for k in ("main", "stale", "delayed", "orphan", "dead_letters") for a in ("--queue", q[k].name)),
                 "--orphan-marks")


#: What the second run finds: nothing more in main, stale and delayed; the orphan queue's old
#: mark; in dead_letters the redriven mail's row and mark (delivered since), the two contents no
#: dead letter holds any more (one in the small-blob table, one in S3), and two orphan marks: the
#: redrive and the purge each mark their dead letter's mail, whose row the first run dropped; and
#: the two contents a journaled move held in the first run (its entry removed since).
RESWEPT = {"rows": 1, "marks": 1 + 1 + 2, "blobs": 2 + 2, "slices": 1, "events": 1, "orphan_marks": 1 + 2}


def dead_letter_names(s: Suite, queue: str) -> list[str]:
    request = browse_pb2.BrowseDeadLettersRequest(queue=queue)
    return sorted(d.mail.mail.name for d in s.browse_stub.BrowseDeadLetters(request))


def expected_totals(sh: Shared) -> dict:
    """The shared runs' totals, from each queue's expectations: its dead rows, the marks they had
    before the sweep, its distinct collectable blobs."""
    return {
        "rows": sum(len(q.dead) for q in sh.queues.values()),
        "marks": sum(m is not None for k in sh.queues for m in sh.before[k]["marks"]),
        "blobs": sum(len(q.gone_blobs) for q in sh.queues.values()),
    }


def test_sweep_drops_dead_slices_marks_and_blobs_and_keeps_live_mails(sweep_suite, swept, reswept):
    s, sh = sweep_suite, swept
    main, stale = sh.queues["main"], sh.queues["stale"]
    assert sh.extra["stale_cleared"] == 3
    assert sh.extra["main_in_small_table"] == [i not in (1, 4) for i in range(8)]
    # Before the sweep: every dead row and its mark is there, every blob too.
    for key in ("main", "stale", "deleted", "delayed"):
        assert sh.before[key]["rows"] == len(sh.queues[key].dead), key
        assert all(sh.before[key]["marks"]), key
        assert sh.before[key]["blobs"] == ([True] * len(sh.queues[key].gone_blobs), [True] * len(sh.queues[key].kept_blobs)), key
    assert len(main.dead) == 8 and len(main.gone_blobs) == 7  # the shared blob stays
    totals = expected_totals(sh)  # main 8 rows, 7 blobs; stale 3 rows, 1 blob; + the other tests' queues
    assert totals["rows"] == 8 + 3 + 3 + 4 + 2 and totals["blobs"] == 7 + 1 + 3 + 4

    planned = sh.planned
    assert planned["dry_run"] is True
    assert {k: planned[k] for k in ("rows", "marks", "blobs")} == totals
    assert sh.after_dry_run["main"]["rows"] == 8, "dry run changed rows"
    assert all(m for k in sh.queues for m in sh.after_dry_run[k]["marks"]), "dry run dropped marks"
    assert all(all(b) for k in sh.queues for b in (sh.after_dry_run[k]["blobs"])), "dry run deleted blobs"
    assert {k: sh.after_dry_run[k]["rows"] for k in sh.queues} == {k: sh.before[k]["rows"] for k in sh.queues}
    assert sh.after_dry_run["main"]["content_start"] < main.browse_start

    done = sh.done
    assert {k: done[k] for k in ("rows", "marks", "blobs")} == totals
    # One SWEPT event per row removed, in each mail's history, by the sweep component; the rerun
    # (reswept) writes one for the one row it removes (dead_letters' redriven mail: RESWEPT).
    assert planned["events"] == done["events"] == totals["rows"] and reswept["events"] == RESWEPT["events"]
    events = events_pb2_grpc.EventServiceStub(s.browse.channel())
    for mail in (main.dead[0], stale.dead[0]):
        story = list(events.GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=mail)).events)
        last = story[-1]
        assert [e.type for e in story].count(events_pb2.EVENT_TYPE_SWEPT) == 1, story
        assert (last.type, last.actor.kind, last.actor.identity, last.enqueue_id) == (
            events_pb2.EVENT_TYPE_SWEPT, events_pb2.ACTOR_KIND_COMPONENT, "sweep", mail), last
        assert "removed by the retention sweep" in last.reason and last.id
    # main and delayed span two slices at least, stale, deleted and dead_letters one.
    assert done["slices"] >= 2 + 1 + 1 + 2 + 1 and done["partitions"] == done["slices"] and done["bytes_reclaimed"] > 0
    for key in ("main", "stale"):
        assert sh.after[key]["rows"] == 0, key
        assert sh.after[key]["marks"] == [None] * len(sh.queues[key].dead), key
    assert sh.after["main"]["blobs"] == ([False] * 7, [True])  # the shared blob is kept
    assert sh.after["stale"]["blobs"] == ([False], [])
    assert sh.after["main"]["content_start"] == main.browse_start

    # Run again, nothing more is found for these queues (what it finds is the orphan queue's mark,
    # on request, test_orphan_marks_are_collected_on_request, and dead_letters', test_dead_letters_...).
    again = reswept
    assert {k: again[k] for k in RESWEPT} == RESWEPT
    assert content_start(s, main.name) == main.browse_start

    # The operator-deleted mails lost their marks with their slice: dequeue skips them as swept.
    swept_before = s.metric("dequeue", "mailqueue_skipped_total", queue=stale.name, reason="swept")
    assert message_count(stale.name) == len(stale.dead)
    c = StreamConsumer(s.dequeue_stub, stale.name)

    def skipped() -> float:
        return s.metric("dequeue", "mailqueue_skipped_total", queue=stale.name, reason="swept") - swept_before

    wait_until(lambda: skipped() >= 3, what="the stale messages to be skipped as swept")
    assert skipped() == 3 and message_count(stale.name) == 0
    with pytest.raises(queue_mod.Empty):
        c.next(timeout=0.5)  # nothing was handed out
    c.close()

    # The live mails still browse and dequeue with their content.
    live = sh.extra["live"]
    assert sorted(s.browsed_names(main.name)) == sorted(live)
    assert drain(s, main.name, 3) == live


def test_a_sweep_killed_at_each_step_then_rerun_converges(sweep_suite):
    s = sweep_suite
    queue = s.new_queue()
    began = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    dead = history(s, queue, 6)
    blobs = dead_blob_ids(dead)
    next_slice()
    s.enqueue_mail(queue, "live", b"still here")
    browse_start = advance_browse_start(s, queue)

    sweep(s, "--queue", queue, failpoint="after-content-start", expect=137)
    assert content_start(s, queue) == browse_start
    assert len(rows_before(s, queue, began, browse_start)) == 6 and all(blob_exists(s, b) for b in blobs)

    sweep(s, "--queue", queue, failpoint="after-marks", expect=137)
    assert [mark(s, queue, r.enqueue_id) for r in dead] == [None] * 6
    assert len(rows_before(s, queue, began, browse_start)) == 6, "rows are dropped after their marks"

    done = sweep(s, "--queue", queue)
    # Two slices, or three when the machine is slow enough for the second half to cross a 1 s window.
    spanned = {slices.slice_start(r.enqueued_at.ToDatetime(dt.timezone.utc), dt.timedelta(seconds=1)) for r in dead}
    assert {k: done[k] for k in ("rows", "marks", "slices")} == {"rows": 6, "marks": 0, "slices": len(spanned)}
    # The killed run wrote the SWEPT events already; written again, each has the same id: one per mail.
    events = events_pb2_grpc.EventServiceStub(s.browse.channel())
    for r in dead:
        story = events.GetMailHistory(events_pb2.GetMailHistoryRequest(enqueue_id=r.enqueue_id)).events
        assert [e.type for e in story].count(events_pb2.EVENT_TYPE_SWEPT) == 1, story
    # Converged: the state a complete sweep leaves, read directly (that a rerun then finds
    # nothing is test_sweep_drops_dead_slices_marks_and_blobs_and_keeps_live_mails' last run).
    assert rows_before(s, queue, began, browse_start) == []
    assert [mark(s, queue, r.enqueue_id) for r in dead] == [None] * 6
    assert not any(blob_exists(s, b) or in_small_table(s, b) for b in blobs)
    assert content_start(s, queue) == browse_start
    assert drain(s, queue, 1) == {"live": b"still here"}


def test_orphan_marks_are_collected_on_request(sweep_suite, swept, reswept):
    s, sh = sweep_suite, swept
    queue = sh.queues["orphan"].name
    # Not looked for by default (the shared run of every queue): the old mark is still there.
    assert sh.planned["orphan_marks"] == 0 and sh.done["orphan_marks"] == 0
    assert sh.extra["orphan_marks_after"] == ("enqueue failed", "enqueue failed")
    # On request: the old one only (the run's other orphan marks are dead_letters': RESWEPT).
    done = reswept
    assert done["orphan_marks"] == RESWEPT["orphan_marks"] and done["marks"] == RESWEPT["marks"]
    assert mark(s, queue, str(sh.extra["orphan_old"])) is None
    assert mark(s, queue, str(sh.extra["orphan_recent"])) == "enqueue failed"
    assert drain(s, queue, 1) == {"live": b"x"}


def test_a_sweep_during_enqueue_and_dequeue_loses_no_mail(sweep_suite):
    s = sweep_suite
    queue = s.new_queue()
    old = uuid.uuid4().hex
    history(s, queue, 20, lambda i: f"old {old} {i % 3}".encode())
    advance_browse_start(s, queue)
    stop, produced = threading.Event(), threading.Event()
    sent: dict[str, bytes] = {}
    got: dict[str, bytes] = {}
    errors: list[BaseException] = []
    ended: list[str] = []  # why a consumer stream ended, as a client that resubscribes sees it

    def produce() -> None:
        i = 0
        try:
            while not stop.is_set():
                # Every other mail reuses an old content: its blob is deduplicated (and touched).
                content = f"old {old} {i % 3}".encode() if i % 2 == 0 else f"new {i} {uuid.uuid4()}".encode()
                s.enqueue_mail(queue, f"n-{i}", content)
                sent[f"n-{i}"] = content
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            produced.set()

    def consume() -> None:
        c = StreamConsumer(s.dequeue_stub, queue, prefetch=8)
        deadline = None
        try:
            while True:
                if produced.is_set():  # drain what was sent, for at most a minute
                    deadline = deadline or time.monotonic() + 60
                    if len(got) >= len(sent) or time.monotonic() > deadline:
                        break
                try:
                    d = c.next(timeout=1)
                except EOFError:  # the stream ended (UNAVAILABLE while Spark loads Cassandra): subscribe again
                    ended.append(str(c.error))
                    c = StreamConsumer(s.dequeue_stub, queue, prefetch=8)
                    continue
                except Exception:  # noqa: BLE001 - queue.Empty: poll the stop flag again
                    continue
                got[d.mail.mail.name] = d.content
                c.answer(d)
        finally:
            c.close()

    threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(sent) >= 20, what="traffic to start")
        done = sweep(s, "--queue", queue)
    finally:
        stop.set()
        threads[0].join(30)
    threads[1].join(90)
    assert not errors, errors
    assert done["rows"] == 20
    assert len(sent) >= 20
    print(f"during the sweep: {len(sent)} mails enqueued, {len(got)} delivered, streams ended: {ended}")
    assert got == sent, f"lost {sorted(set(sent) - set(got))[:5]}, wrong content {[n for n in got if got[n] != sent.get(n)][:5]}"
    # The last answers are settled (marked, counted) after they were sent: wait for them. An answer
    # sent on a stream that ended before it was settled (max connection age) was not: that mail
    # comes back and is answered again.
    c = StreamConsumer(s.dequeue_stub, queue, prefetch=8)

    def settled() -> bool:
        while True:
            try:
                d = c.next(timeout=0.05)
            except queue_mod.Empty:
                break
            assert got.get(d.mail.mail.name) == d.content  # delivered before, with the same content
            c.answer(d)
        return s.size(queue) == 0

    wait_until(settled, 30, what="the last answered mails to be settled")
    c.close()


@pytest.mark.parametrize("backend,env", [
    ("cassandra", {"MAILQUEUE_CASSANDRA_PORT": "1"}),
    ("s3", {"MAILQUEUE_S3_ENDPOINT": "127.0.0.1:1"}),
])
def test_an_unreachable_backend_exits_3_and_names_it(sweep_suite, backend, env):
    out = sweep(sweep_suite, expect=3, **env)
    assert f"{backend} unavailable" in out["stderr"]
    assert "rerun" in out["stderr"]


def test_missing_connector_jars_exit_2_and_say_how_to_fetch_them(sweep_suite, tmp_path):
    out = sweep(sweep_suite, "--jars", str(tmp_path), expect=2)
    assert "spark/connector.sh" in out["stderr"]


def test_delayed_and_retried_mails_survive_the_sweep_and_flush_out_with_their_content(sweep_suite, swept):
    s, sh = sweep_suite, swept
    q = sh.queues["delayed"]
    assert sh.extra["delayed_first"] == "retried"
    # The dead history only (its 4 rows and marks are in the shared run's totals, see the first test).
    assert sh.before["delayed"]["rows"] == 4 and all(sh.before["delayed"]["marks"])
    assert sh.after["delayed"]["rows"] == 0 and sh.after["delayed"]["marks"] == [None] * 4
    assert sh.after["delayed"]["blobs"] == ([False] * 4, [])
    assert len(rows_before(s, q.name, q.end, dt.datetime.now(dt.timezone.utc))) == 2  # the delayed and the retried
    info = s.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=q.name)).queue_info
    assert (info.size, info.delayed) == (2, 2) and sh.after["delayed"]["content_start"] <= q.browse_start
    assert s.admin_stub.Flush(admin_pb2.FlushRequest(queue=q.name)).flushed == 2
    assert drain(s, q.name, 2) == {"delayed": b"delayed content", "retried": b"retried content"}


def test_a_deleted_queues_content_is_swept(sweep_suite, swept):
    """DeleteQueue leaves the content to the sweep: the dropped queue stays in its list."""
    sh = swept
    q = sh.queues["deleted"]
    progress = sh.extra["deleted_progress"]
    assert progress[-1].done and progress[-1].mails_deleted == 3
    assert not sh.extra["deleted_listed"]
    assert sh.before["deleted"]["rows"] == 3
    # The run of every queue read the dropped one from dropped_queues_v1.
    assert q.name in sh.done["content_starts"]
    assert sh.after["deleted"]["rows"] == 0
    assert sh.after["deleted"]["marks"] == [None] * 3
    assert sh.after["deleted"]["blobs"] == ([False] * 3, [])


def test_dead_letters_keep_their_content_until_purged(sweep_suite, swept, reswept):
    """The sweep drops a dead letter's row with its slice, never its content: a redrive after the
    sweep delivers it whole; once the dead letter is purged, the next sweep takes the content."""
    s, sh = sweep_suite, swept
    q = sh.queues["dead_letters"]
    small, large = q.kept_blobs
    assert sh.before["dead_letters"]["rows"] == 2
    assert sh.after["dead_letters"]["rows"] == 0  # their rows are swept...
    assert sh.after["dead_letters"]["blobs"] == ([], [True, True])  # ...their content is not
    assert sh.extra["large_in_s3"]  # the large one is an S3 object
    # After that run (the reswept fixture): the large one redriven, delivered whole; both purged.
    assert sh.extra["dl_redriven"] == 1
    assert sh.extra["dl_delivered"] == {"large": sh.extra["large_content"]}
    assert sh.extra["dl_purged"] == 1 and sh.extra["dl_left"] == []
    # The next run took both contents (RESWEPT: blobs 2).
    assert reswept["content_starts"][q.name]
    assert not blob_exists(s, small) and not blob_exists(s, large) and not in_small_table(s, small)
    # The marks the redrive and the purge wrote, for rows the first run had dropped: collected as orphans.
    assert [mark(s, q.name, e) for e in q.dead] == [None, None]


def test_the_content_of_a_move_under_way_is_kept(swept):
    """A MoveMails (or a redrive) cut by a SIGKILL holds its mail in its journal entry until the
    next MoveMails or the healer completes it; the source row may be swept meanwhile, and the
    content must still be there when the mail lands."""
    assert swept.extra["journaled_kept"] == [True, True]
