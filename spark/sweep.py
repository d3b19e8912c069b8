"""Retention sweep: keeps the view's tables and the blob bucket bounded (DESIGN §4).

    python -m spark.sweep [--dry-run] [--grace 1h] [--blob-grace 1h] [--master local[*]]

For every queue, slices strictly before ``browse_start - grace`` are dropped (deleted marks,
then rows) after content start has been advanced past them; then blobs that no remaining
row references and that are older than the blob grace are collected. The rules are in
services/domain/retention.py; this module reads with Spark (the Cassandra connector scans the tables
by token range) and deletes from Spark tasks with the Python driver and obstore.

Idempotent and resumable: every step is a delete or a forward-only move, so a run killed at any
instant and run again ends in the same state. Connection settings are the services' own
(MAILQUEUE_CASSANDRA_*, MAILQUEUE_S3_*). Exit codes: 0 done, 1 failed half-way (rerun it),
2 bad usage or configuration, 3 a backend is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import logging
import os
import socket
import sys
import time
from typing import Any

from services.adapters.cassandra import schema
from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.cassandra.view import View
from services.adapters.s3.settings import S3Settings
from services.domain import retention, slices
from services.domain.durations import parse_duration
from services.domain.errors import BackendUnavailable, ConfigurationError, InvalidArgument
from services.domain.settings import EventSettings
from services.runtime import logs
from services.runtime.settings import cassandra_from_env, events_from_env, s3_from_env
from spark import buckets, executors, session

log = logging.getLogger("spark.sweep")

NEVER_MS = -(2**62)
#: Crash points for the resumability tests: the process dies like a SIGKILL after that step.
FAILPOINT_ENV = "MAILQUEUE_SWEEP_FAILPOINT"
EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 1, 2, 3



def duration_arg(text: str) -> dt.timedelta:
    """parse_duration for argparse: its message on a bad value."""
    try:
        return parse_duration(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None

def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m spark.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="change nothing; report what would be deleted")
    p.add_argument("--grace", type=duration_arg, default=env("MAILQUEUE_SWEEP_GRACE", "1h"),
                   help="keep slices this long before browse start (default 1h)")
    p.add_argument("--blob-grace", type=duration_arg, default=env("MAILQUEUE_SWEEP_BLOB_GRACE", "1h"),
                   help="never collect a blob written or reused more recently (default 1h; must exceed the longest enqueue)")
    p.add_argument("--queue", action="append", dest="queues", metavar="NAME", help="sweep only this queue (repeatable)")
    p.add_argument("--no-blobs", action="store_true", help="skip blob collection")
    p.add_argument("--orphan-marks", action="store_true",
                   help="also drop deleted marks without a row (left by failed enqueues); scans the whole marks table")
    p.add_argument("--master", default=env("MAILQUEUE_SPARK_MASTER", "local[*]"), help="Spark master (default local[*])")
    p.add_argument("--jars", default=env("MAILQUEUE_SPARK_JARS"), help="connector jars: a folder or a comma separated list")
    p.add_argument("--parallelism", type=int, default=int(env("MAILQUEUE_SWEEP_PARALLELISM", "4")),
                   help="Spark tasks that delete at once (default 4)")
    p.add_argument("--summary-file", default=env("MAILQUEUE_SWEEP_SUMMARY", "sweep-summary.json"),
                   help="where the JSON summary is written ('-' for stdout only)")
    return p


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    cassandra: CassandraSettings
    s3: S3Settings
    started: dt.datetime
    loop: asyncio.AbstractEventLoop
    view: View
    #: Whether SWEPT events are written, and their TTL (MAILQUEUE_EVENTS, MAILQUEUE_HISTORY_RETENTION_S).
    events: EventSettings = dataclasses.field(default_factory=EventSettings)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)


#: The key of a mail in the view's tables.
KEYS = ["queue_name", "enqueue_id"]


def _failpoint(step: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == step:
        log.warning("failpoint reached: exiting like a kill", extra={"step": step})
        logging.shutdown()
        os._exit(137)


def _ms(instant: dt.datetime) -> int:
    return slices._ms(instant)


def load_plans(ctx: Context) -> list[retention.QueuePlan]:
    window = ctx.run(ctx.view.config.current()).slice_window
    # Dropped queues too (DeleteQueue): their content is left to this sweep.
    queues = ctx.args.queues or sorted({*ctx.run(ctx.view.queues.all()), *ctx.run(ctx.view.queues.all_dropped())})
    plans = []
    for queue in sorted(queues):
        p = retention.plan(
            queue, ctx.run(ctx.view.starts.browse_start(queue)), ctx.run(ctx.view.starts.content_start(queue)),
            ctx.args.grace, window,
        )
        if p is None:
            log.warning("queue has no browse start: skipped", extra={"queue": queue})
        else:
            plans.append(p)
    return plans


def sweep(ctx: Context, spark: Any) -> retention.Summary:
    """The four steps, in the order that keeps a crash at any instant harmless (rerun converges)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    summary = retention.Summary(dry_run=ctx.args.dry_run)
    plans = load_plans(ctx)
    summary.queues = len(plans)
    log.info("plans loaded", extra={"queues": len(plans), "grace_s": ctx.args.grace.total_seconds()})
    held = None if ctx.args.no_blobs else _held_blobs(ctx, spark)
    rows = _table(spark, ctx, schema.ENQUEUED_MAILS).select(
        "queue_name", F.unix_millis("slice_start").alias("slice_ms"), "bucket", "enqueue_id", "blob_ids",
    ).persist(StorageLevel.MEMORY_AND_DISK)
    log.info("view scanned", extra={"rows": rows.count()})
    checked, first_live = _find_live(ctx, spark, rows, plans)
    new_starts = _move_content_starts(ctx, plans, first_live, summary)
    _failpoint("after-content-start")
    starts_df = spark.createDataFrame([(q, _ms(s)) for q, s in new_starts.items()], "queue_name string, cs_ms long")
    _drop_dead_slices(ctx, spark, rows, checked, starts_df, summary)
    if not ctx.args.no_blobs:
        _collect_blobs(ctx, spark, rows, held, starts_df, summary)
    return summary


def _table(spark: Any, ctx: Context, name: str, **options: str) -> Any:
    return spark.read.format("org.apache.spark.sql.cassandra").options(keyspace=ctx.cassandra.keyspace, table=name, **options).load()


def _find_live(ctx: Context, spark: Any, rows: Any, plans: list[retention.QueuePlan]) -> tuple[Any, dict[str, dt.datetime]]:
    """1. Every row before its queue's drop point with whether its mail has a mark (``checked``),
    and each queue's first slice with a live mail there: it holds that slice and every later one."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Marks are looked up by key (the connector's direct join: point reads), never scanned: the
    # table is mostly tombstones once sweeps have run, and a scan would cost its whole history.
    marks = _table(spark, ctx, schema.DELETED_MAILS, directJoinSetting="on").select(*KEYS, "deleted_at")
    plan_df = spark.createDataFrame(
        [(p.queue, _ms(p.content_start) if p.content_start else NEVER_MS, _ms(p.drop_before)) for p in plans],
        "queue_name string, old_ms long, drop_ms long",
    )
    checked = (
        rows.join(F.broadcast(plan_df), "queue_name").where(F.col("slice_ms") < F.col("drop_ms"))
        .select(*KEYS, "slice_ms", "old_ms").join(marks, KEYS, "left")
        .select(*KEYS, "slice_ms", "old_ms", F.col("deleted_at").isNotNull().alias("marked"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    live = (
        checked.where(~F.col("marked") & (F.col("slice_ms") >= F.col("old_ms")))
        .groupBy("queue_name").agg(F.min("slice_ms").alias("first_ms"))
    )
    return checked, {r.queue_name: slices.from_ms(r.first_ms) for r in live.collect()}


def _move_content_starts(ctx: Context, plans: list[retention.QueuePlan], first_live: dict[str, dt.datetime],
                         summary: retention.Summary) -> dict[str, dt.datetime]:
    """2. Content start moves first: from now on dequeue treats those slices as gone."""
    new_starts: dict[str, dt.datetime] = {}
    for p in plans:
        target = retention.new_content_start(p, first_live.get(p.queue))
        if p.queue in first_live and first_live[p.queue] < p.drop_before:
            held = first_live[p.queue].isoformat()
            summary.live_slices_held.append({"queue": p.queue, "slice_start": held})
            log.warning("live mail in a slice before browse start - grace: kept", extra={"queue": p.queue, "slice_start": held})
        if not ctx.args.dry_run and (p.content_start is None or target > p.content_start):
            target = ctx.run(ctx.view.starts.advance_content_start(p.queue, target))
        new_starts[p.queue] = target
        summary.content_starts[p.queue] = target.isoformat()
    return new_starts


def _drop_dead_slices(ctx: Context, spark: Any, rows: Any, checked: Any, starts_df: Any, summary: retention.Summary) -> None:
    """3. Rows before the new content start: a SWEPT event for each mail, then their marks, then
    their partitions (events first: a crash after them writes the same event ids again)."""
    from pyspark.sql import functions as F

    a, ks = ctx.args, ctx.cassandra.keyspace
    dead = rows.join(F.broadcast(starts_df), "queue_name").where(F.col("slice_ms") < F.col("cs_ms"))
    # One row per partition with its row count: rows, partitions and slices in one action (not
    # three scans of the cached view).
    partitions = dead.groupBy("queue_name", "slice_ms", "bucket").agg(F.count("*").alias("n")).persist()
    doomed_marks = (
        checked.where(F.col("marked")).join(F.broadcast(starts_df), "queue_name")
        .where(F.col("slice_ms") < F.col("cs_ms")).select(*KEYS).persist()
    )
    found = partitions.agg(F.sum("n").alias("rows"), F.count("*").alias("partitions"),
                           F.countDistinct("queue_name", "slice_ms").alias("slices")).first()
    summary.rows, summary.partitions, summary.slices = int(found.rows or 0), int(found.partitions), int(found.slices)
    summary.marks = doomed_marks.count()
    summary.events = summary.rows if ctx.events.enabled else 0
    if a.orphan_marks:
        # Marks whose row never landed (an enqueue that failed after writing nothing): a full scan.
        every_mark = _table(spark, ctx, schema.DELETED_MAILS).select(*KEYS, F.unix_millis("deleted_at").alias("deleted_ms"))
        orphans = (
            every_mark.join(F.broadcast(starts_df), "queue_name").where(F.col("deleted_ms") < F.col("cs_ms"))
            .select(*KEYS).join(rows.select(*KEYS), KEYS, "left_anti").persist()
        )
        summary.orphan_marks = orphans.count()
        summary.marks += summary.orphan_marks
        doomed_marks = doomed_marks.union(orphans)
    log.info("dead slices found", extra={"slices": summary.slices, "partitions": summary.partitions, "rows": summary.rows,
                                         "marks": summary.marks})
    if a.dry_run:
        return
    # Nothing found, nothing to run: no Spark job, no task connecting to Cassandra for nothing.
    done = spark.sparkContext.accumulator(0)
    if summary.events:
        record = executors.record_swept(ctx.cassandra, ks, ctx.events.history_retention_s, ctx.started,
                                        f"{socket.gethostname()}/sweep", done)
        dead.select(*KEYS, "slice_ms").coalesce(a.parallelism).foreachPartition(record)
        summary.events = done.value
    log.info("swept events recorded", extra={"events": done.value})
    _failpoint("after-events")
    done = spark.sparkContext.accumulator(0)
    if summary.marks:
        doomed_marks.coalesce(a.parallelism).foreachPartition(executors.delete_marks(ctx.cassandra, ks, done))
    log.info("deleted marks dropped", extra={"marks": done.value})
    _failpoint("after-marks")
    done = spark.sparkContext.accumulator(0)
    if summary.partitions:
        partitions.coalesce(a.parallelism).foreachPartition(executors.delete_partitions(ctx.cassandra, ks, done))
    log.info("partitions deleted", extra={"partitions": done.value})
    _failpoint("after-partitions")


def _held_blobs(ctx: Context, spark: Any) -> Any:
    """0. The blobs dead letters and the moves journal hold, read before the rows (``blob_id``).

    Dead letters keep their content until they are redriven or purged (their rows may be gone);
    a move or a redrive under way holds its mail's content in its journal entry, whose source row
    may be marked and swept, or whose dead letter may be removed, before the landed row is written.
    Read first, dead letters before the journal, they leave no gap: a redrive journals its dead
    letter before it removes it, and a move or a redrive removes its journal entry only after
    what replaces it was written, so a mail's content is referenced in this snapshot or in the
    rows read after it. (The journal read first, a redrive journaled and removed its dead letter
    between the two reads: killed before it landed, its content was in neither, and swept.)"""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from services.contract.serde import queued_mail_from_bytes

    dead = (_table(spark, ctx, schema.DEAD_LETTERS).select(F.explode("blob_ids").alias("blob_id"))
            .persist(StorageLevel.MEMORY_AND_DISK))
    dead.count()  # read now (Spark is lazy): before the journal
    journal = _table(spark, ctx, schema.MOVES).select("body", "source_body").collect()  # moves under way: a few rows
    journaled = sorted({b for r in journal for body in (r.body, r.source_body) if body
                        for b in queued_mail_from_bytes(bytes(body)).blob_ids})
    held = (dead.union(spark.createDataFrame([(b,) for b in journaled], "blob_id string"))
            .distinct().persist(StorageLevel.MEMORY_AND_DISK))
    log.info("dead letters and moves under way read", extra={"held_blobs": held.count(), "journaled_blobs": len(journaled)})
    return held  # (``dead`` stays persisted: recomputed later, it would miss what was removed since)


def _collect_blobs(ctx: Context, spark: Any, rows: Any, held: Any, starts_df: Any, summary: retention.Summary) -> None:
    """4. Blobs no remaining row references and nothing ``held`` (step 0), older than the blob
    grace: in Cassandra, then in S3."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    a, ks = ctx.args, ctx.cassandra.keyspace
    referenced = (
        rows.join(F.broadcast(starts_df), "queue_name", "left")
        .where(F.col("cs_ms").isNull() | (F.col("slice_ms") >= F.col("cs_ms")))
        .select(F.explode("blob_ids").alias("blob_id")).union(held).distinct()
    ).persist(StorageLevel.MEMORY_AND_DISK)
    cutoff = ctx.started - a.blob_grace
    small = (
        _table(spark, ctx, schema.BLOBS).select("blob_id", "size", "written_at")
        .where(F.col("written_at") < F.lit(cutoff)).join(referenced, "blob_id", "left_anti").persist()
    )
    found = small.agg(F.count("*").alias("n"), F.sum("size").alias("bytes")).first()
    summary.blobs, summary.bytes_reclaimed = int(found.n or 0), int(found.bytes or 0)
    log.info("unreferenced small blobs found", extra={"blobs": summary.blobs, "bytes": summary.bytes_reclaimed})
    if not a.dry_run and summary.blobs:
        count, size = spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0)
        small.coalesce(a.parallelism).foreachPartition(executors.delete_small_blobs(ctx.cassandra, ks, cutoff, count, size))
        summary.blobs, summary.bytes_reclaimed = count.value, size.value
    if not buckets.usable(ctx.s3, ks, claim=not a.dry_run):
        return
    prefixes = executors.blob_prefixes()
    listed = spark.sparkContext.parallelize(prefixes, min(len(prefixes), 4 * a.parallelism)).mapPartitions(
        executors.list_blobs(ctx.s3, ctx.started, a.blob_grace)
    ).toDF("blob_id string, size long, modified_ms long")
    garbage = listed.join(referenced, "blob_id", "left_anti").persist()
    found = garbage.agg(F.count("*").alias("n"), F.sum("size").alias("bytes")).first()
    blobs, reclaimed = int(found.n or 0), int(found.bytes or 0)
    log.info("unreferenced S3 blobs found", extra={"blobs": blobs, "bytes": reclaimed})
    if not a.dry_run and blobs:
        count, size = spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0)
        garbage.coalesce(a.parallelism).foreachPartition(executors.delete_blobs(ctx.s3, ctx.started, a.blob_grace, count, size))
        # Blobs reused since the listing were kept: report what was really deleted.
        blobs, reclaimed = count.value, size.value
    summary.blobs += blobs
    summary.bytes_reclaimed += reclaimed


def _report(summary: retention.Summary, path: str) -> None:
    for line in summary.lines():
        print(line)
    document = json.dumps(dataclasses.asdict(summary), indent=2, sort_keys=True)
    if path == "-":
        print(document)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(document + "\n")
        print(f"  summary written to {path}")
    log.info("sweep finished", extra={k: v for k, v in dataclasses.asdict(summary).items() if not isinstance(v, (list, dict))})


def _fail(code: int, message: str) -> int:
    print(f"sweep: {message}", file=sys.stderr)
    log.error(message, extra={"exit_code": code})
    return code


def _root_cause(e: BaseException) -> str:
    """The innermost Java exception's message of a Py4J error (the first line says only which call
    failed): what an operator needs to act on, e.g. a certificate the driver refused."""
    java = getattr(e, "java_exception", None)
    try:
        while java is not None and java.getCause() is not None:
            java = java.getCause()
        return f"; caused by {java.toString()[:1500]}" if java is not None else ""
    except Exception:  # noqa: BLE001 - the gateway may be gone already
        return ""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure("sweep", logs.level_of(os.environ))  # any case, as the services take it
    try:
        cassandra, s3, events = cassandra_from_env(), s3_from_env(), events_from_env()
        jars = session.connector_jars(args.jars)
    except (ConfigurationError, session.MissingJars) as e:
        return _fail(EXIT_USAGE, str(e))
    started = dt.datetime.now(dt.timezone.utc)
    clock = time.monotonic()
    loop = asyncio.new_event_loop()
    view: View | None = None
    try:
        view = loop.run_until_complete(View.open(cassandra))
        buckets.ping(s3)
        ctx = Context(args, cassandra, s3, started, loop, view, events)
        spark = session.build(args.master, jars, cassandra, shuffle_partitions=max(4, 2 * args.parallelism))
        try:
            summary = sweep(ctx, spark)
        finally:
            spark.stop()
    except BackendUnavailable as e:
        return _fail(EXIT_UNAVAILABLE, f"{e} - start it or fix MAILQUEUE_{e.backend.upper()}_* (nothing half-done is lost: rerun when it is back)")
    except buckets.BucketOwnedElsewhere as e:
        return _fail(EXIT_USAGE, str(e))
    except Exception as e:  # noqa: BLE001 - Spark wraps every task failure in a Py4J error
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        code = EXIT_UNAVAILABLE if any(m in str(e) for m in buckets.UNREACHABLE_MARKERS) else EXIT_FAILED
        return _fail(code, f"failed half-way ({type(e).__name__}: {first[:500]}{_root_cause(e)}); the sweep is resumable: run it again")
    finally:
        if view is not None:
            view.close()
        loop.close()
    summary.duration_s = round(time.monotonic() - clock, 2)
    _report(summary, args.summary_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
