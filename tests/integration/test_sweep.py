"""The retention sweep (#6) against the real Cassandra and MinIO, Spark in local mode.

Each run is the real command line (``python -m spark.sweep``) in a subprocess, on a keyspace and
a bucket of this module's own, with 1-second slices.
"""

from __future__ import annotations

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
import pytest

from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2
from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.domain import model, slices
from tests.conftest import Suite
from tests.harness import ROOT, new_keyspace, wait_until
from tests.integration.helpers import (
    StreamConsumer,
    enqueue_names,
    inline,
    message_count,
    simple_mail,
)
from tests.integration.test_browse_admin import next_slice


@pytest.fixture(scope="module")
def sweep_suite(aio_loop, running_stack) -> Suite:
    s = Suite(
        aio_loop, new_keyspace(), MAILQUEUE_SLICE_WINDOW_S="1", MAILQUEUE_BROWSE_START_PACE="1000000",
        MAILQUEUE_S3_BUCKET=f"mq-sweep-{uuid.uuid4().hex[:8]}", MAILQUEUE_S3_TOUCH_INTERVAL_S="0",
    )
    yield s
    s.stop(drop=True)


def sweep(s: Suite, *args: str, failpoint: str = "", expect: int = 0, **env: str) -> dict:
    """Run the sweep's command line; return its JSON summary."""
    summary = os.path.join(ROOT, ".stack", f"sweep-{uuid.uuid4().hex[:8]}.json")
    run_env = dict(s.env, MAILQUEUE_SWEEP_FAILPOINT=failpoint, **env)
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


def test_sweep_drops_dead_slices_marks_and_blobs_and_keeps_live_mails(sweep_suite):
    s = sweep_suite
    queue, stale = s.new_queue(), s.new_queue()
    began = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    shared = f"shared content {uuid.uuid4()}".encode()
    # Two contents over 64 KiB live in S3, the others in the small-blob table: both are collected.
    dead = history(s, queue, 8, lambda i: shared if i == 7 else (
        os.urandom(LARGE) if i in (1, 4) else f"dead {i} {uuid.uuid4()}".encode()))
    # A second queue whose mails are deleted by an operator: their RabbitMQ messages stay queued.
    stale_ids = enqueue_names(s, stale, ["x1", "x2", "x3"])
    assert sum(p.progress.deleted for p in s.admin_stub.ClearQueue(admin_pb2.ClearQueueRequest(queue=stale))) == 3
    dead_blobs = dead_blob_ids(dead)
    assert [in_small_table(s, b) for b in dead_blobs] == [i not in (1, 4) for i in range(8)]
    next_slice()
    live = {f"live-{i}": (shared if i == 0 else f"live content {i}".encode()) for i in range(3)}
    for name, content in live.items():
        s.enqueue_mail(queue, name, content)
    browse_start = advance_browse_start(s, queue)
    advance_browse_start(s, stale)
    assert len(rows_before(s, queue, began, browse_start)) == 8

    planned = sweep(s, "--dry-run")
    assert planned["dry_run"] is True
    assert planned["rows"] == 8 + 3 and planned["marks"] == 8 + 3
    assert planned["blobs"] == 7 + 1  # seven own contents + the stale queue's one; the shared blob stays
    assert len(rows_before(s, queue, began, browse_start)) == 8, "dry run changed rows"
    assert all(mark(s, queue, r.enqueue_id) for r in dead), "dry run dropped marks"
    assert all(blob_exists(s, b) for b in dead_blobs), "dry run deleted blobs"
    assert content_start(s, queue) < browse_start

    done = sweep(s)
    assert {k: done[k] for k in ("rows", "marks", "blobs")} == {"rows": 11, "marks": 11, "blobs": 8}
    assert done["slices"] >= 3 and done["partitions"] == done["slices"] and done["bytes_reclaimed"] > 0
    assert rows_before(s, queue, began, browse_start) == []
    assert [mark(s, queue, r.enqueue_id) for r in dead] == [None] * 8
    assert [blob_exists(s, b) for b in dead_blobs] == [False] * 7 + [True]  # the shared blob is kept
    assert content_start(s, queue) == browse_start

    again = sweep(s)
    assert {k: again[k] for k in ("rows", "marks", "blobs", "slices")} == {"rows": 0, "marks": 0, "blobs": 0, "slices": 0}

    # The operator-deleted mails lost their marks with their slice: dequeue skips them as swept.
    swept_before = s.metric("dequeue", "mailqueue_skipped_total", queue=stale, reason="swept")
    assert message_count(stale) == len(stale_ids)
    c = StreamConsumer(s.dequeue_stub, stale)

    def swept() -> float:
        return s.metric("dequeue", "mailqueue_skipped_total", queue=stale, reason="swept") - swept_before

    wait_until(lambda: swept() >= 3, what="the stale messages to be skipped as swept")
    assert swept() == 3 and message_count(stale) == 0
    with pytest.raises(queue_mod.Empty):
        c.next(timeout=0.5)  # nothing was handed out
    c.close()

    # The live mails still browse and dequeue with their content.
    assert sorted(s.browsed_names(queue)) == sorted(live)
    assert drain(s, queue, 3) == live


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
    # Converged: the state a complete sweep leaves, read directly (that a rerun then finds
    # nothing is test_sweep_drops_dead_slices_marks_and_blobs_and_keeps_live_mails' last run).
    assert rows_before(s, queue, began, browse_start) == []
    assert [mark(s, queue, r.enqueue_id) for r in dead] == [None] * 6
    assert not any(blob_exists(s, b) or in_small_table(s, b) for b in blobs)
    assert content_start(s, queue) == browse_start
    assert drain(s, queue, 1) == {"live": b"still here"}


def test_orphan_marks_are_collected_on_request(sweep_suite):
    s = sweep_suite
    queue = s.new_queue()
    s.enqueue_mail(queue, "live", b"x")
    browse_start = advance_browse_start(s, queue)
    # A mark whose row never landed (an enqueue that failed long ago), and one written just now.
    old, recent = uuid.uuid4(), uuid.uuid4()
    table = f"{s.keyspace}.deleted_mails_v1"
    insert = f"INSERT INTO {table} (queue_name, enqueue_id, reason, deleted_at) VALUES (%s, %s, 'enqueue failed', %s)"
    s.view.session.execute(insert, (queue, old, browse_start - dt.timedelta(minutes=5)))
    s.view.session.execute(insert, (queue, recent, dt.datetime.now(dt.timezone.utc)))

    # Not looked for by default (blobs are not what this test is about: --no-blobs, as below).
    assert sweep(s, "--queue", queue, "--no-blobs")["orphan_marks"] == 0
    assert mark(s, queue, str(old))
    done = sweep(s, "--queue", queue, "--orphan-marks", "--no-blobs")
    assert done["orphan_marks"] == 1 and done["marks"] == 1
    assert mark(s, queue, str(old)) is None and mark(s, queue, str(recent)) == "enqueue failed"
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


def test_delayed_and_retried_mails_survive_the_sweep_and_flush_out_with_their_content(sweep_suite):
    s = sweep_suite
    queue = s.new_queue()
    history(s, queue, 4)
    next_slice()
    delayed = inline(queue, simple_mail("delayed"), b"delayed content")
    delayed.delay.FromTimedelta(dt.timedelta(hours=1))
    s.enqueue_stub.Enqueue(delayed)
    s.enqueue_mail(queue, "retried", b"retried content")
    c = StreamConsumer(s.dequeue_stub, queue)
    first = c.next()
    assert first.mail.mail.name == "retried"
    c.answer(first, "RETRY", "451 later", retry_after=3600)  # its schedule row has no deleted_at
    wait_until(lambda: [r.mail.attempts for r in s.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, name="retried"))] == [1],
               what="the retry recorded")
    c.close()
    browse_start = advance_browse_start(s, queue)
    done = sweep(s, "--queue", queue)
    assert done["rows"] == 4 and done["marks"] == 4  # the dead history only
    info = s.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info
    assert (info.size, info.delayed) == (2, 2) and content_start(s, queue) <= browse_start
    assert s.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue)).flushed == 2
    assert drain(s, queue, 2) == {"delayed": b"delayed content", "retried": b"retried content"}


def test_a_deleted_queues_content_is_swept(sweep_suite):
    """DeleteQueue leaves the content to the sweep: the dropped queue stays in its list."""
    s = sweep_suite
    queue = s.new_queue()
    began = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    receipts = [s.enqueue_mail(queue, f"m{i}", f"dropped {i} {uuid.uuid4()}".encode()) for i in range(3)]
    progress = list(s.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=queue, force=True)))
    assert progress[-1].done and progress[-1].mails_deleted == 3
    assert queue not in s.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues
    now = dt.datetime.now(dt.timezone.utc)
    assert len(rows_before(s, queue, began, now)) == 3
    sweep(s)  # every queue: the dropped one is read from dropped_queues_v1
    assert rows_before(s, queue, began, now) == []
    assert [mark(s, queue, r.enqueue_id) for r in receipts] == [None] * 3
    assert [blob_exists(s, b) for b in dead_blob_ids(receipts)] == [False] * 3


def test_dead_letters_keep_their_content_until_purged(sweep_suite):
    """The sweep drops a dead letter's row with its slice, never its content: a redrive after the
    sweep delivers it whole; once the dead letter is purged, the next sweep takes the content."""
    s = sweep_suite
    queue = s.new_queue()
    began = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    small = s.enqueue_mail(queue, "small", f"small {uuid.uuid4()}".encode())
    large_content = os.urandom(LARGE)
    large = s.enqueue_mail(queue, "large", large_content)
    c = StreamConsumer(s.dequeue_stub, queue)
    for d in c.take(2):
        c.answer(d, "REJECT", "550 no such user")
    c.close()

    def dead_names():
        request = browse_pb2.BrowseDeadLettersRequest(queue=queue)
        return sorted(d.mail.mail.name for d in s.browse_stub.BrowseDeadLetters(request))

    wait_until(lambda: dead_names() == ["large", "small"], 30, what="both mails dead letters")
    advance_browse_start(s, queue)
    now = dt.datetime.now(dt.timezone.utc)
    sweep(s, "--queue", queue)
    assert rows_before(s, queue, began, now) == []  # their rows are swept...
    assert blob_exists(s, small.blob_ids[0]) and blob_exists(s, large.blob_ids[0])  # ...their content is not
    assert not in_small_table(s, large.blob_ids[0])  # the large one is an S3 object
    final = list(s.admin_stub.RedriveDeadLetters(admin_pb2.RedriveDeadLettersRequest(
        queue=queue, filter=browse_pb2.DeadLetterFilter(name="large"))))[-1]
    assert final.redriven == 1
    assert drain(s, queue, 1) == {"large": large_content}
    purged = list(s.admin_stub.PurgeDeadLetters(admin_pb2.PurgeDeadLettersRequest(queue=queue, all=True)))[-1]
    assert purged.purged == 1 and dead_names() == []
    advance_browse_start(s, queue)
    sweep(s, "--queue", queue)
    assert not blob_exists(s, small.blob_ids[0]) and not blob_exists(s, large.blob_ids[0])
