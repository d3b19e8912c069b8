"""How to reach Cassandra: a plain value, built from MAILQUEUE_CASSANDRA_* (and the credentials
folder) by services/runtime/settings.py, which describes each variable."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CassandraSettings:
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    keyspace: str = "mailqueue"
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    local_dc: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str = ""
    request_timeout_s: float = 5.0
    counter_flush_s: float = 1.0
