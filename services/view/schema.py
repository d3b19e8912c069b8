"""The whole Cassandra schema of the view, in one place (ADR-31, DESIGN §3).

Created idempotently at start-up (``IF NOT EXISTS``); a new layout gets new versioned tables.
Rows are written without null cells: absent values are left unset (nulls are tombstones).
"""

from __future__ import annotations

from cassandra.cluster import Session

from services.names import table

ENQUEUED_MAILS = table("enqueued_mails")
DELETED_MAILS = table("deleted_mails")
BROWSE_START = table("browse_start")
CONTENT_START = table("content_start")
QUEUES = table("queues")
CONFIG_EVENTS = table("queue_view_config_events")
IDEMPOTENCY = table("enqueue_idempotency")

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
        blob_ids list<text>, size bigint,
        PRIMARY KEY ((queue_name, slice_start, bucket), enqueued_at, enqueue_id)
    ) WITH comment = 'Time series of every mail ever enqueued, by (queue, slice, bucket). Never updated; dropped slice by slice by the retention sweep once before browse_start.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{DELETED_MAILS} (
        queue_name text, enqueue_id uuid, reason text, deleted_at timestamp,
        PRIMARY KEY ((queue_name, enqueue_id))
    ) WITH comment = 'This mail is gone (dequeued, deleted or dead-lettered): browse and dequeue skip it.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{BROWSE_START} (
        queue_name text PRIMARY KEY, browse_start timestamp
    ) WITH comment = 'Every slice before browse_start holds only deleted mails. Only moves forward.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{CONTENT_START} (
        queue_name text PRIMARY KEY, content_start timestamp
    ) WITH comment = 'Every slice before content_start has been swept: its rows no longer exist.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{QUEUES} (
        queue_name text PRIMARY KEY, created_at timestamp
    ) WITH comment = 'Every queue that exists (CreateQueue).'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{CONFIG_EVENTS} (
        aggregate_id text, event_id int,
        slice_window_ms bigint, bucket_count int, update_browse_start_pace int, recorded_at timestamp,
        PRIMARY KEY (aggregate_id, event_id)
    ) WITH CLUSTERING ORDER BY (event_id DESC)
      AND comment = 'Event-sourced view configuration; each event appended with a lightweight transaction.'""",
    f"""CREATE TABLE IF NOT EXISTS {{ks}}.{IDEMPOTENCY} (
        queue_name text, idempotency_key text,
        enqueue_id uuid, claimed_at timestamp, committed boolean,
        enqueued_at timestamp, blob_ids list<text>, size bigint,
        PRIMARY KEY ((queue_name, idempotency_key))
    ) WITH default_time_to_live = {IDEMPOTENCY_TTL_S}
      AND comment = 'Client idempotency keys: a retried enqueue gets the first enqueue id back.'""",
]


def create(session: Session, keyspace: str, replication: str) -> None:
    """Create the keyspace and every table if missing (blocking; idempotent).

    Statements name tables with their keyspace (no ``USE``): the session serves one keyspace.
    """
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}", timeout=60)
    for ddl in TABLES:
        session.execute(ddl.format(ks=keyspace), timeout=60)
