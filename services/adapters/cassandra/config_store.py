"""The event-sourced view configuration: each change is an event appended with an LWT.

Identical configuration appends nothing; a change that breaks a rule is refused; two writers
racing for the same event id are resolved by Cassandra's lightweight transaction (the loser
re-reads and re-checks).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.domain import model
from services.domain.errors import Aborted
from services.domain.view_config import check_change, check_values

log = logging.getLogger(__name__)

#: The single aggregate: one configuration for every queue, as in James.
AGGREGATE = "mailqueue-view-configuration"
MAX_RACES = 5


class ConfigStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.CONFIG_EVENTS}"
        self._latest = session.prepare(
            f"SELECT event_id, slice_window_ms, bucket_count, update_browse_start_pace FROM {t} "
            "WHERE aggregate_id = ? LIMIT 1"
        )
        self._append = session.prepare(
            f"INSERT INTO {t} (aggregate_id, event_id, slice_window_ms, bucket_count, update_browse_start_pace, "
            "recorded_at) VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )

    async def _read(self) -> tuple[int, model.ViewConfig | None]:
        rows = await execute(self._session, self._latest, (AGGREGATE,))
        if not rows:
            return 0, None
        r = rows[0]
        return r.event_id, model.ViewConfig(
            dt.timedelta(milliseconds=r.slice_window_ms), r.bucket_count, r.update_browse_start_pace
        )

    async def current(self) -> model.ViewConfig:
        """The configuration in force (the defaults until a first event is stored)."""
        return (await self._read())[1] or model.ViewConfig()

    async def apply(
        self, wanted: model.ViewConfig, before_write: Callable[[model.ViewConfig, int], Awaitable[None]] | None = None,
    ) -> model.ViewConfig:
        """Make ``wanted`` the configuration. Raises FailedPrecondition naming a broken rule.
        ``before_write(current, number)`` runs once the change from ``current`` is known to be
        allowed, before it is written as event ``number`` (the audit event: a change refused
        records nothing; its number tells a value set back apart from its first setting)."""
        check_values(wanted)
        for attempt in range(1, MAX_RACES + 1):
            event_id, current = await self._read()
            # Before a first event is stored every process runs on the defaults and writes rows in
            # their slices: the defaults are the configuration in force, and the rules apply to them.
            current = current or model.ViewConfig()
            if current == wanted and event_id:
                return current
            check_change(current, wanted)
            if before_write is not None:
                await before_write(current, event_id + 1)
            rows = await execute(
                self._session,
                self._append,
                (AGGREGATE, event_id + 1, wanted.slice_window // dt.timedelta(milliseconds=1),
                 wanted.bucket_count, wanted.update_browse_start_pace, model.utcnow()),
            )
            if rows[0].applied:
                log.info("view configuration changed", extra={"event_id": event_id + 1, "config": str(wanted)})
                return wanted
            log.warning("configuration write raced with another writer [%d/%d]; re-reading", attempt, MAX_RACES)
        raise Aborted("the view configuration is being changed concurrently; retry")
