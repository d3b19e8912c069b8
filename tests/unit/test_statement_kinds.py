"""Cassandra requests are counted by verb and table (services/adapters/cassandra/statement_kinds.py)."""

from __future__ import annotations

import pytest
from cassandra.query import BatchStatement, SimpleStatement

from services.adapters.cassandra.statement_kinds import batch_kind, kind_of, kind_of_query


@pytest.mark.parametrize(("query", "kind"), [
    ("INSERT INTO ks.enqueued_mails_v1 (a, b) VALUES (?, ?)", "insert enqueued_mails_v1"),
    ("insert into \"Ks\".\"Blobs\" (a) values (?) USING TTL 10", "insert blobs"),
    ("INSERT INTO ks.enqueue_idempotency_v1 (k) VALUES (?) IF NOT EXISTS", "insert enqueue_idempotency_v1 lwt"),
    ("UPDATE ks.queue_counters_v1 SET n = n + ? WHERE queue_name = ?", "update queue_counters_v1"),
    ("UPDATE ks.leases SET owner = ? WHERE k = ? IF owner = ?", "update leases lwt"),
    ("DELETE FROM ks.blobs_v1 WHERE blob_id = ? IF EXISTS", "delete blobs_v1 lwt"),
    ("SELECT a, toUnixTimestamp(b) AS c FROM ks.t WHERE x = ? AND y IN ?", "select t"),
    ("SELECT release_version FROM system.local", "select local"),
    ("TRUNCATE ks.t", "truncate"),
])
def test_a_query_is_counted_by_its_verb_and_table_without_the_keyspace(query, kind):
    assert kind_of_query(query) == kind


def test_statements_are_counted_by_their_query_and_a_batch_by_its_first_statement():
    simple = SimpleStatement("SELECT a FROM ks.t WHERE k = ?")
    assert kind_of(simple) == "select t"
    assert kind_of("UPDATE ks.t SET a = ? WHERE k = ?") == "update t"
    assert kind_of(BatchStatement()) == "batch"
    assert batch_kind(simple) == "batch select t"
