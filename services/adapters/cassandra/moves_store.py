"""``moves_v1``: the journal of MoveMails, one partition per source queue.

A mail's move is written here (with the mail as it lands in the target queue) before its source
copy is marked moved, and removed once the target copy is stored and published: a move
interrupted in between is completed by the next MoveMails from that queue.
"""

from __future__ import annotations

import datetime as dt

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute, execute_all
from services.contract import serde
from services.domain import model


class MovesStore:
    def __init__(self, session: Session, keyspace: str) -> None:
        self._session = session
        t = f"{keyspace}.{schema.MOVES}"
        self._begin = session.prepare(f"INSERT INTO {t} (queue_name, enqueue_id, target, body, source_body) VALUES (?, ?, ?, ?, ?)")
        self._pending = session.prepare(f"SELECT body, source_body, WRITETIME(body) AS written FROM {t} WHERE queue_name = ?")
        self._done = session.prepare(f"DELETE FROM {t} WHERE queue_name = ? AND enqueue_id = ?")

    async def begin(self, mail: model.QueuedMail, moved: model.QueuedMail) -> None:
        await execute(self._session, self._begin, (mail.queue, mail.enqueue_id, moved.queue, serde.queued_mail_to_bytes(moved),
                                                   serde.queued_mail_to_bytes(mail)))

    async def pending(self, source: str) -> list[tuple[model.QueuedMail, model.QueuedMail, dt.datetime]]:
        rows = await execute_all(self._session, self._pending, (source,))
        return [(serde.queued_mail_from_bytes(r.source_body), serde.queued_mail_from_bytes(r.body),
                 dt.datetime.fromtimestamp(r.written / 1e6, dt.timezone.utc)) for r in rows]

    async def done(self, mail: model.QueuedMail) -> None:
        await execute(self._session, self._done, (mail.queue, mail.enqueue_id))
