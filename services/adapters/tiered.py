"""Two blob stores as one: small blobs in Cassandra, the rest in the large store (S3 or blob_svc).

Ids are the same content hash in both, so readers look in the small store first (a point read;
a miss costs a bloom-filter check) and then in the large one. A put is routed by its size: the
first ``small.max_bytes + 1`` bytes are buffered, and a stream that ends within them goes to
Cassandra, anything longer streams on to the large store.

With the large store down, small mail is still enqueued and delivered: ``ping`` (readiness) asks
Cassandra only, and the large store's state is a gauge and a log line, not a reason for a load
balancer to send no mail at all; large content is UNAVAILABLE meanwhile. A large store that
refuses this process's credentials (blob_svc and a wrong MAILQUEUE_SERVICE_TOKEN) is a setting to
fix, not an outage: that fails readiness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from prometheus_client import Gauge

from services.adapters.cassandra.blobs import CassandraBlobStore
from services.domain.errors import BackendUnavailable, CredentialsRefused, NotFound
from services.domain.model import BlobInfo
from services.ports.blobstore import BlobStore, chunked

log = logging.getLogger(__name__)

#: Seconds the large store's check may take before it counts as down.
LARGE_CHECK_S = 4.0

LARGE_UP = Gauge("mailqueue_large_blob_store_up",
                 "1 while the large blob store (S3, or blob_svc) answers this process's checks; 0: large content is UNAVAILABLE, "
                 "small content (in Cassandra) is still enqueued and delivered")


class TieredBlobStore(BlobStore):
    def __init__(self, small: CassandraBlobStore, large: BlobStore) -> None:
        self.small = small
        self.large = large
        #: Why the large store did not answer the last check (None: it did).
        self.large_down: str | None = None
        LARGE_UP.set(1)

    async def put(self, chunks: AsyncIterator[bytes], expected_id: str | None = None) -> BlobInfo:
        stream = aiter(chunks)
        head = bytearray()
        async for chunk in stream:
            head += chunk
            if len(head) > self.small.max_bytes:
                break
        else:
            return await self.small.put_bytes(bytes(head), expected_id)

        async def rest() -> AsyncIterator[bytes]:
            yield bytes(head)
            async for chunk in stream:
                yield chunk

        return await self.large.put(rest(), expected_id)

    async def put_bytes(self, data: bytes, expected_id: str | None = None) -> BlobInfo:
        if len(data) <= self.small.max_bytes:
            return await self.small.put_bytes(data, expected_id)
        return await self.large.put_bytes(data, expected_id)

    async def store(self, data: bytes) -> BlobInfo:
        if len(data) <= self.small.max_bytes:
            return await self.small.store(data)
        return await self.large.put_bytes(data)

    async def get(self, blob_id: str) -> AsyncIterator[bytes]:
        content = await self.small.lookup(blob_id)
        if content is not None:
            for chunk in chunked(content):
                yield chunk
            return
        async for chunk in self.large.get(blob_id):
            yield chunk

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        parts = []
        for blob_id in blob_ids:
            content = await self.small.lookup(blob_id)
            parts.append(content if content is not None else await self.large.read([blob_id]))
        return b"".join(parts)

    async def read_content(self, blob_ids: tuple[str, ...] | list[str], size: int) -> bytes:
        """One blob over the small limit is in the large store, unless it was stored while the
        limit was higher (MAILQUEUE_SMALL_BLOB_BYTES lowered since, or another value on another
        replica): looked up in Cassandra only when the large store has no such blob."""
        if len(blob_ids) == 1 and size > self.small.max_bytes:
            try:
                return await self.large.read(blob_ids)
            except NotFound:
                pass  # read as any other: Cassandra first
        return await self.read(blob_ids)

    async def stat(self, blob_id: str) -> BlobInfo:
        try:
            return await self.small.stat(blob_id)
        except NotFound:
            return await self.large.stat(blob_id)

    async def keep(self, blob_id: str) -> BlobInfo:
        try:
            return await self.small.keep(blob_id)
        except NotFound:
            return await self.large.keep(blob_id)

    async def delete(self, blob_id: str) -> bool:
        """Deleted from both tiers. A blob found in Cassandra's is deleted whatever S3 answers (a
        blob lives in one tier: its row gone, the call did what it asked; it answered UNAVAILABLE,
        "not applied", and the retry found nothing, existed=false)."""
        if await self.small.delete(blob_id):
            try:
                await self.large.delete(blob_id)
            except BackendUnavailable as e:
                log.warning("a small blob deleted; its S3 check failed: %s", e, extra={"blob_id": blob_id})
            return True
        return await self.large.delete(blob_id)

    async def ping(self) -> None:
        """Readiness: Cassandra's tier. The large store is checked too, its state kept, never raised."""
        await self.small.ping()
        try:  # bounded below the whole check's bound (services/runtime/server.py): S3's client retries
            async with asyncio.timeout(LARGE_CHECK_S):
                await self.large.ping()
        except CredentialsRefused:  # a setting to fix, not an outage: readiness says so
            raise
        except (BackendUnavailable, TimeoutError) as e:
            e = e if isinstance(e, BackendUnavailable) else BackendUnavailable("blobs", f"no answer within {LARGE_CHECK_S:g} s")
            if self.large_down is None:
                log.warning("the large blob store does not answer: large content is UNAVAILABLE, small content is still "
                            "enqueued and delivered", extra={"error": str(e)[:300]})
            self.large_down = str(e)
            LARGE_UP.set(0)
            return
        if self.large_down is not None:
            log.info("the large blob store answers again")
        self.large_down = None
        LARGE_UP.set(1)

    async def close(self) -> None:
        await self.small.close()
        await self.large.close()
