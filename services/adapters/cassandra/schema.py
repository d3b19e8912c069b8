"""The whole Cassandra schema of the view, in one place (ADR-31, DESIGN §3).

Created idempotently at start-up (``IF NOT EXISTS``); a new layout gets new versioned tables.
Rows are written without null cells: absent values are left unset (nulls are tombstones).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time

from cassandra import InvalidRequest, Unauthorized
from cassandra.cluster import Cluster, Session

from services.domain.names import table

log = logging.getLogger(__name__)

ENQUEUED_MAILS = table("enqueued_mails")
DELETED_MAILS = table("deleted_mails")
BROWSE_START = table("browse_start")
CONTENT_START = table("content_start")
QUEUES = table("queues")
DROPPED_QUEUES = table("dropped_queues")
MOVES = table("moves")
DEAD_LETTERS = table("dead_letters")
DEAD_LETTER_HOURS = table("dead_letter_hours")
LEASES = table("leases")
CONFIG_EVENTS = table("queue_view_config_events")
IDEMPOTENCY = table("enqueue_idempotency")
ENQUEUERS = table("enqueuers")
RETRY_POLICIES = table("retry_policies")
RULES = table("rules")
COUNTERS = table("queue_counters")
BLOBS = table("blobs")
SHAPING = table("traffic_shaping")
SHAPING_FAILURES = table("shaping_failures")
MAIL_HISTORY = table("mail_history")
MAIL_HISTORY_NAMES = table("mail_history_name_days")
MAIL_HISTORY_GROUPS = table("mail_history_groups")

#: The history tables' TTL when a write names none (MAILQUEUE_HISTORY_RETENTION_S, 7 days, names it per write).
HISTORY_TTL_S = 7 * 24 * 3600
#: Expired history cells are purged this long after they expire. The only deletes are a change's
#: rows taken back when the event stream refused its events (event_log.py ``_take_back``, rare): a
#: replica down longer than this may bring such a row back at repair, a stale event at worst, so a
#: short grace only bounds what compaction keeps.
HISTORY_GC_GRACE_S = 3 * 3600
#: History rows go into SSTables by day of writing; a whole day's SSTable is dropped, unread, once
#: every row in it has expired (TWCS: no tombstone is ever read or compacted row by row).
#: (Doubled braces: the statements are formatted with the keyspace.)
_HISTORY_COMPACTION = ("{{'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'DAYS', "
                       "'compaction_window_size': 1}}")
WEBHOOK_CHECKPOINTS = table("webhook_checkpoints")
# --- webhook registrations (WebhookAdminService) ---
WEBHOOKS = table("webhooks")
# --- end webhook registrations ---

#: Idempotency keys are remembered this long.
IDEMPOTENCY_TTL_S = 24 * 3600

TABLES = [
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{ENQUEUED_MAILS} (
        queue_name text, slice_start timestamp, bucket int,
        enqueued_at timestamp, enqueue_id uuid,
        name text, sender text, recipients list<text>,
        state text, error_message text, remote_host text, remote_addr text, last_updated timestamp,
        attributes map<text, text>,
        per_recipient_headers list<frozen<tuple<text, text, text>>>,
        blob_ids list<text>, size bigint, deliver_at timestamp, priority text, traceparent text,
        PRIMARY KEY ((queue_name, slice_start, bucket), enqueued_at, enqueue_id)
    ) WITH comment = 'Time series of every mail ever enqueued, by (queue, slice, bucket). Never updated; dropped slice by slice by the retention sweep once before browse_start.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DELETED_MAILS} (
        queue_name text, enqueue_id uuid, reason text, deleted_at timestamp,
        generation int, deliver_at timestamp, attempts int, last_error text, held_by uuid,
        PRIMARY KEY ((queue_name, enqueue_id))
    ) WITH comment = 'Per mail: gone (reason and deleted_at set: dequeued, deleted or dead-lettered; browse and dequeue skip it), or its schedule once a RETRY or a Flush changed it (generation, deliver_at, attempts, last_error).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{BROWSE_START} (
        queue_name text PRIMARY KEY, browse_start timestamp
    ) WITH comment = 'Every slice before browse_start holds only deleted mails. Only moves forward.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{CONTENT_START} (
        queue_name text PRIMARY KEY, content_start timestamp
    ) WITH comment = 'Every slice before content_start has been swept: its rows no longer exist.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{QUEUES} (
        queue_name text PRIMARY KEY, created_at timestamp
    ) WITH comment = 'Every queue that exists (CreateQueue).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{LEASES} (
        name text PRIMARY KEY, holder text
    ) WITH comment = 'Background work one replica does at a time (the healer): its holder, the row TTL ending the lease.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{MOVES} (
        queue_name text, enqueue_id uuid, target text, body blob, source_body blob,
        PRIMARY KEY ((queue_name), enqueue_id)
    ) WITH comment = 'MoveMails in progress, per source queue: the mail as it lands in the target (body) and as it was in the source (source_body), both QueuedMail. Removed once the target copy is published.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DEAD_LETTERS} (
        queue_name text, hour int, enqueued_at timestamp, enqueue_id uuid,
        kind text, reason text, dead_at timestamp, blob_ids list<text>, body blob,
        PRIMARY KEY ((queue_name, hour), enqueued_at, enqueue_id)
    ) WITH comment = 'Dead letters, per queue and hour of enqueue (hours since the epoch): the mail (body: QueuedMail with its attempts and last error), why it died (kind, reason) and when. blob_ids keep its content from the retention sweep. Removed by a redrive or a purge.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DEAD_LETTER_HOURS} (
        queue_name text, hour int,
        PRIMARY KEY ((queue_name), hour)
    ) WITH comment = 'The hours of dead_letters_v1 that have held a dead letter, per queue (what a browse, count, redrive or purge reads).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DROPPED_QUEUES} (
        queue_name text PRIMARY KEY, dropped_at timestamp, done_at timestamp
    ) WITH comment = 'Queues deleted (DeleteQueue): no longer listed or accepting mail; the retention sweep still sweeps their content. done_at: when the deletion completed (null: under way or interrupted, a DeleteQueue completes it).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{CONFIG_EVENTS} (
        aggregate_id text, event_id int,
        slice_window_ms bigint, bucket_count int, update_browse_start_pace int, recorded_at timestamp,
        PRIMARY KEY (aggregate_id, event_id)
    ) WITH CLUSTERING ORDER BY (event_id DESC)
      AND comment = 'Event-sourced view configuration; each event appended with a lightweight transaction.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{IDEMPOTENCY} (
        queue_name text, idempotency_key text,
        enqueue_id uuid, claimed_at timestamp, committed boolean, owner uuid,
        enqueued_at timestamp, blob_ids list<text>, size bigint,
        PRIMARY KEY ((queue_name, idempotency_key))
    ) WITH default_time_to_live = {IDEMPOTENCY_TTL_S}
      AND comment = 'Client idempotency keys: a retried enqueue gets the first enqueue id back. owner: the enqueuers_v1 lease of the process whose attempt holds an uncommitted claim.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{ENQUEUERS} (
        enqueuer uuid PRIMARY KEY, host text
    ) WITH gc_grace_seconds = 3600
      AND comment = 'The enqueue_svc processes alive: each rewrites its row every third of MAILQUEUE_CLAIM_LEASE_S with that TTL, so the row is gone within the lease of the process death. A retry that finds an idempotency claim whose owner has no row takes the claim over.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{RETRY_POLICIES} (
        queue_name text PRIMARY KEY,
        initial_backoff_ms bigint, multiplier double, max_backoff_ms bigint, max_attempts int, max_age_ms bigint
    ) WITH comment = 'Per queue: how RETRYs are spaced and when a mail expires (no row: the defaults).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{RULES} (
        scope text, rule_id uuid, kind text, queue_name text, recipient_domain text, sender text, name text,
        reason text, created_at timestamp, expires_at timestamp,
        PRIMARY KEY (scope, rule_id)
    ) WITH comment = 'Operator hold and bounce rules: one small partition, each row with a TTL to its expiry.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{COUNTERS} (
        queue_name text, kind text, slice_start timestamp, count counter,
        PRIMARY KEY ((queue_name), kind, slice_start)
    ) WITH comment = 'Approximate per-slice counts (enqueued, gone, delayed, held, dead_lettered) for cheap size and gauges; healed by ReconcileCounters.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{BLOBS} (
        blob_id text PRIMARY KEY, content blob, size bigint, written_at timestamp
    ) WITH comment = 'Mail content up to MAILQUEUE_SMALL_BLOB_BYTES, content-addressed (id = SHA-256 hex); larger content is in S3. written_at is refreshed when a put reuses the blob; the retention sweep collects blobs no row references.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{SHAPING} (
        part int, kind text, name text, body text,
        PRIMARY KEY (part, kind, name)
    ) WITH gc_grace_seconds = 3600
      AND comment = 'Traffic shaping, one small partition read by every dequeue member each second: throttles, sites, automatic rules, effects (TTL to their end) and the consuming members (TTL: their heartbeat). body is JSON.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{SHAPING_FAILURES} (
        destination text, rule_id text, at timeuuid,
        PRIMARY KEY ((destination, rule_id), at)
    ) WITH default_time_to_live = 86400 AND gc_grace_seconds = 3600
      AND comment = 'RETRY errors matching an automatic shaping rule, counted within the rule window (each row TTL: the window).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{MAIL_HISTORY} (
        enqueue_id uuid, event_id text,
        at timestamp, type text, queue_name text, name text, sender text, attempt int, reason text, replica text,
        actor_kind text, actor_role text, actor_identity text, traceparent text, details map<text, text>,
        PRIMARY KEY ((enqueue_id), event_id)
    ) WITH default_time_to_live = {HISTORY_TTL_S} AND gc_grace_seconds = {HISTORY_GC_GRACE_S}
      AND compaction = {_HISTORY_COMPACTION}
      AND comment = 'Every event of a mail (services/domain/events.py), one partition per enqueue id: a history costs one partition read at any depth. A change written twice has one event id, so one row. Each row with a TTL of the history retention; deleted only when the change is taken back (the event stream refused its events: services/adapters/cassandra/event_log.py), else left to TWCS, which drops expired days whole.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{MAIL_HISTORY_GROUPS} (
        history_key uuid, written timeuuid, events blob,
        PRIMARY KEY ((history_key), written)
    ) WITH default_time_to_live = {HISTORY_TTL_S} AND gc_grace_seconds = {HISTORY_GC_GRACE_S}
      AND compaction = {_HISTORY_COMPACTION}
      AND comment = 'The events the services record, one partition per history key (the 96 bits the enqueue ids of a group share, services/domain/events.py): a row per write, holding the events of that write for the mails of the key (a mailqueue.v1.EventBatch). A mail history is one partition read; each row with a TTL of the history retention; deleted only when the change is taken back (the event stream refused its events).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{MAIL_HISTORY_NAMES} (
        name text, day int, at timestamp, history_key uuid,
        PRIMARY KEY ((name, day), at, history_key)
    ) WITH CLUSTERING ORDER BY (at DESC, history_key ASC)
      AND default_time_to_live = {HISTORY_TTL_S} AND gc_grace_seconds = {HISTORY_GC_GRACE_S}
      AND compaction = {_HISTORY_COMPACTION}
      AND comment = 'The history keys holding the mails of a name, newest first, one partition per name and day (days since the epoch, UTC): a row per write and key (mails of one name enqueued together are one row), so no name makes a partition grow without bound. GetMailHistory by name reads the days of the retention at once. Same TTL as mail_history_groups_v1.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{WEBHOOK_CHECKPOINTS} (
        endpoint text PRIMARY KEY, cursor text, updated timestamp
    ) WITH comment = 'Per webhook endpoint: the event-stream cursor of the last event it took (webhook_svc resumes after it). Overwritten in place, never deleted: no tombstones.'""",
    # --- webhook registrations (WebhookAdminService) ---
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{WEBHOOKS} (
        part int, name text, url text, secret_file text, types list<text>, queues list<text>,
        max_age_s double, from_oldest boolean, created_at timestamp,
        PRIMARY KEY (part, name)
    ) WITH gc_grace_seconds = 3600
      AND comment = 'Registered webhook endpoints (mailq webhook add), one small partition read by webhook_svc every MAILQUEUE_WEBHOOK_RELOAD_S. secret_file is the path of the HMAC secret webhook_svc reads; the secret itself is never stored. Added IF NOT EXISTS, removed IF EXISTS (a handful of tombstones, purged after an hour).'""",
    # --- end webhook registrations ---
]

#: Storage-attached indexes (SAI, Cassandra 5): Browse by name or by enqueue id reads the rows of
#: that name or id, not the queue. An index entry is part of its row's SSTable, not a row of its
#: own: it adds no tombstone, and the sweep's partition deletes take both.
#: The column each index serves, by name.
INDEXED = {f"{ENQUEUED_MAILS}_name": "name", f"{ENQUEUED_MAILS}_enqueue_id": "enqueue_id"}
INDEXES = [
    f"CREATE CUSTOM INDEX IF NOT EXISTS {index} ON {{ks}}.{ENQUEUED_MAILS} ({column}) USING 'StorageAttachedIndex'"
    for index, column in INDEXED.items()
]

#: Columns added to tables that existed before them (idempotent: ADD IF NOT EXISTS).
MIGRATIONS = [
    f"ALTER TABLE {{ks}}.{ENQUEUED_MAILS} ADD IF NOT EXISTS deliver_at timestamp",
    f"ALTER TABLE {{ks}}.{ENQUEUED_MAILS} ADD IF NOT EXISTS priority text",
    f"ALTER TABLE {{ks}}.{ENQUEUED_MAILS} ADD IF NOT EXISTS traceparent text",
    f"ALTER TABLE {{ks}}.{IDEMPOTENCY} ADD IF NOT EXISTS owner uuid",
    f"ALTER TABLE {{ks}}.{DROPPED_QUEUES} ADD IF NOT EXISTS done_at timestamp",
    *(f"ALTER TABLE {{ks}}.{DELETED_MAILS} ADD IF NOT EXISTS {column}"
      for column in ("generation int", "deliver_at timestamp", "attempts int", "last_error text", "held_by uuid",
                     "published boolean")),
]


def create(session: Session, keyspace: str, replication: str) -> None:
    """Create the keyspace and every table if missing (blocking; idempotent).

    Statements name tables with their keyspace (no ``USE``): the session serves one keyspace.
    The role that runs it owns what it creates (Cassandra grants the creator every permission):
    with authorization on, that is the schema role, never a service's (``migrate``).
    """
    _ddl(session, f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}")
    for ddl in [*TABLES, *MIGRATIONS, *INDEXES]:
        _ddl(session, ddl.format(ks=keyspace))


#: How long a DDL statement is retried while its coordinator does not know the keyspace or table
#: the statement before it created.
SCHEMA_AGREEMENT_S = 120.0


def _ddl(session: Session, statement: str) -> None:
    """Run one DDL statement. On a cluster, the node that coordinates it may not have the schema
    change before it yet: the driver waits up to 10 s for agreement after each change, and a node
    that restarted under load (seen after the cluster tier's node faults) can take longer. Such a
    statement answers "Keyspace ... doesn't exist" (or an unconfigured table); it is retried, after
    waiting for the nodes to agree, for up to SCHEMA_AGREEMENT_S."""
    deadline = time.monotonic() + SCHEMA_AGREEMENT_S
    while True:
        try:
            session.execute(statement, timeout=60)
            return
        except InvalidRequest as e:
            if not any(m in str(e) for m in ("doesn't exist", "unconfigured table")) or time.monotonic() > deadline:
                raise
            log.warning("schema not agreed yet, retrying", extra={"statement": statement[:80], "error": str(e)[:200]})
            with contextlib.suppress(Exception):  # the retry is the check
                session.cluster.control_connection.wait_for_schema_agreement(wait_time=10)
            time.sleep(1)


#: The permissions a service's role gets on the keyspace: read and write rows. Nothing else: no
#: CREATE, ALTER, DROP or AUTHORIZE (CQL's MODIFY covers INSERT, UPDATE, DELETE and TRUNCATE).
SERVICE_PERMISSIONS = ("SELECT", "MODIFY")


def grant(session: Session, keyspace: str, roles: tuple[str, ...]) -> None:
    """Give each service role SELECT and MODIFY on the keyspace (run by its owner, the schema role)."""
    for role in roles:
        for permission in SERVICE_PERMISSIONS:
            session.execute(f'GRANT {permission} ON KEYSPACE {keyspace} TO "{role}"', timeout=60)


def missing(cluster: Cluster, keyspace: str) -> list[str]:
    """The tables and columns the keyspace lacks, from the driver's schema metadata (no statement
    run: a service's role, which may not create, checks the schema this way)."""
    ks = cluster.metadata.keyspaces.get(keyspace)
    if ks is None:
        return [f"keyspace {keyspace}"]
    out = [name for name in re.findall(r"CREATE TABLE IF NOT EXISTS \{ks\}\.(\w+)", "\n".join(TABLES)) if name not in ks.tables]
    for name, column in re.findall(r"ALTER TABLE \{ks\}\.(\w+) ADD IF NOT EXISTS (\w+)", "\n".join(MIGRATIONS)):
        if name in ks.tables and column not in ks.tables[name].columns:
            out.append(f"{name}.{column}")
    return out


def missing_indexes(cluster: Cluster, keyspace: str) -> list[str]:
    """The indexes the keyspace lacks. Not required to serve: without one, what it speeds up scans."""
    ks = cluster.metadata.keyspaces.get(keyspace)
    if ks is None:
        return []
    return [name for name, table_name in re.findall(r"INDEX IF NOT EXISTS (\w+) ON \{ks\}\.(\w+)", "\n".join(INDEXES))
            if table_name in ks.tables and name not in ks.tables[table_name].indexes]


def ensure(cluster: Cluster, session: Session, keyspace: str, replication: str) -> None:
    """The schema as a service needs it: nothing to do when it is complete; else created, which
    works for a role allowed to create (no authentication, or the schema role) and otherwise
    fails naming what is missing and the step that makes it."""
    if not missing(cluster, keyspace):
        if missing_indexes(cluster, keyspace):
            try:
                for ddl in INDEXES:
                    session.execute(ddl.format(ks=keyspace), timeout=60)
            except Unauthorized:
                log.warning("keyspace %s lacks the indexes %s, and this role may not create them: Browse by name or id scans "
                            "the queue until the schema step (python -m services.runtime.migrate) adds them",
                            keyspace, ", ".join(missing_indexes(cluster, keyspace)))
        return
    try:
        create(session, keyspace, replication)
    except Unauthorized as e:
        raise SchemaMissing(
            f"keyspace {keyspace} lacks {', '.join(missing(cluster, keyspace)[:3])} and this role may not create it "
            f"({e}): run the schema step with the schema role, `python -m services.runtime.migrate` "
            "(stack/stack.sh up runs it; on Kubernetes, the init container of the browse pods)"
        ) from e


class SchemaMissing(Exception):
    pass
