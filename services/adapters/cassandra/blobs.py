"""Small blobs in a Cassandra table: no S3 object and no blob_svc hop for the bulk of the mail.

A mail queue's content is mostly a few KiB to a few tens of KiB. Stored in S3, each costs an
HTTP PUT, a signature and an object on disk (MinIO spent 1.4 ms of CPU per 10 KiB mail, more
than Cassandra and RabbitMQ together); stored here it is one more write in the Cassandra the
mail's row already goes to. Same content-addressed ids as S3 (lowercase hex SHA-256), so a
blob's id never says where it lives (blobstores/tiered.py looks here first).

``written_at`` plays the part of S3's modification time for the retention sweep: a put that
finds its blob already stored writes the row again (content included, so a concurrent sweep
that removed the row between the read and the write cannot leave a row without content) at
most once per ``touch_interval_s``; the sweep deletes only rows whose ``written_at`` is older
than its blob grace, with a conditional delete.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator

from cassandra.cluster import Session

from services.adapters.cassandra import schema
from services.adapters.cassandra.session import execute
from services.domain import model
from services.domain.errors import InvalidArgument, NotFound, ResourceExhausted
from services.domain.model import BlobInfo
from services.domain.validation import blob_id as check_blob_id
from services.ports.blobstore import BlobStore, chunked

_TOUCHED_MAX = 10_000


class CassandraBlobStore(BlobStore):
    def __init__(self, session: Session, keyspace: str, max_bytes: int, touch_interval_s: float = 60.0) -> None:
        table = f"{keyspace}.{schema.BLOBS}"
        self._session = session
        self._max = max_bytes
        self._touch_interval = touch_interval_s
        self._touched: dict[str, float] = {}
        self._size = session.prepare(f"SELECT size FROM {table} WHERE blob_id = ?")
        self._content = session.prepare(f"SELECT content FROM {table} WHERE blob_id = ?")
        self._insert = session.prepare(f"INSERT INTO {table} (blob_id, content, size, written_at) VALUES (?, ?, ?, ?)")
        self._delete = session.prepare(f"DELETE FROM {table} WHERE blob_id = ?")

    @property
    def max_bytes(self) -> int:
        return self._max

    async def put(self, chunks: AsyncIterator[bytes], expected_id: str | None = None) -> BlobInfo:
        buffer = bytearray()
        async for chunk in chunks:
            buffer += chunk
            self._check_size(len(buffer))
        return await self.put_bytes(bytes(buffer), expected_id)

    async def put_bytes(self, data: bytes, expected_id: str | None = None) -> BlobInfo:
        if expected_id:
            check_blob_id(expected_id)
        self._check_size(len(data))
        blob_id = hashlib.sha256(data).hexdigest()
        if expected_id and expected_id != blob_id:
            raise InvalidArgument(f"content hash {blob_id} differs from the expected blob id {expected_id}")
        found = await execute(self._session, self._size, (blob_id,))
        if not (found and self._touched_recently(blob_id)):
            await self._write(blob_id, data)
        return BlobInfo(blob_id, len(data), deduplicated=bool(found))

    async def store(self, data: bytes) -> BlobInfo:
        """One write, no read: rewriting equal content is harmless and refreshes ``written_at``.
        Content this process wrote within ``touch_interval_s`` (a campaign's one body, enqueued
        again and again) is read instead, and written again only if the row is gone: another
        process (blob_svc's ``Delete``) may have removed it, and a mail acknowledged with it would
        have no content. Unique content, most mail, is one write as before."""
        self._check_size(len(data))
        blob_id = hashlib.sha256(data).hexdigest()
        if self._touched_recently(blob_id) and await execute(self._session, self._size, (blob_id,)):
            return BlobInfo(blob_id, len(data), deduplicated=True)
        await self._write(blob_id, data)
        return BlobInfo(blob_id, len(data))

    async def _write(self, blob_id: str, data: bytes) -> None:
        await execute(self._session, self._insert, (blob_id, data, len(data), model.utcnow()))
        self._touched[blob_id] = time.monotonic()

    def _touched_recently(self, blob_id: str) -> bool:
        last = self._touched.get(blob_id)
        if last is not None and time.monotonic() - last < self._touch_interval:
            return True
        if len(self._touched) >= _TOUCHED_MAX:
            self._touched.clear()
        return False

    def _check_size(self, size: int) -> None:
        if size > self._max:
            raise ResourceExhausted(f"blob exceeds the {self._max} bytes kept in Cassandra")

    async def lookup(self, blob_id: str) -> bytes | None:
        """The blob's bytes, or None when it is not stored here."""
        check_blob_id(blob_id)
        rows = await execute(self._session, self._content, (blob_id,))
        if not rows:
            return None
        return rows[0].content or b""

    async def get(self, blob_id: str) -> AsyncIterator[bytes]:
        content = await self.lookup(blob_id)
        if content is None:
            raise NotFound(f"blob {blob_id} not found")
        for chunk in chunked(content):
            yield chunk

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        parts = []
        for blob_id in blob_ids:
            content = await self.lookup(blob_id)
            if content is None:
                raise NotFound(f"blob {blob_id} not found")
            parts.append(content)
        return b"".join(parts)

    async def stat(self, blob_id: str) -> BlobInfo:
        check_blob_id(blob_id)
        rows = await execute(self._session, self._size, (blob_id,))
        if not rows:
            raise NotFound(f"blob {blob_id} not found")
        return BlobInfo(blob_id, rows[0].size or 0)

    async def keep(self, blob_id: str) -> BlobInfo:
        """Its row written again, content included (at most once per ``touch_interval_s``), as a
        put of equal content does."""
        content = await self.lookup(blob_id)
        if content is None:
            raise NotFound(f"blob {blob_id} not found")
        if not self._touched_recently(blob_id):
            await self._write(blob_id, content)
        return BlobInfo(blob_id, len(content))

    async def delete(self, blob_id: str) -> bool:
        check_blob_id(blob_id)
        if not await execute(self._session, self._size, (blob_id,)):
            return False
        await execute(self._session, self._delete, (blob_id,))
        self._touched.pop(blob_id, None)
        return True

    async def ping(self) -> None:
        await execute(self._session, "SELECT release_version FROM system.local")
