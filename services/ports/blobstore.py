"""The blob store interface: content-addressed mail content (see blobstores/).

Contracts:
- A blob's id is the lowercase hex SHA-256 of its bytes; equal content is stored once.
- ``put`` reads the chunks as they come and never holds the whole blob in memory; when
  ``expected_id`` is given and the hash differs, it raises InvalidArgument and stores nothing.
- ``get``/``stat`` of an unknown id raise NotFound; an unreachable store raises BackendUnavailable.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator

from services.domain.model import BlobInfo

#: Chunk size for streaming reads and writes.
CHUNK = 1024 * 1024


def chunked(content: bytes) -> list[bytes]:
    """Content in memory as the chunks ``get`` yields (one empty chunk for the empty blob)."""
    return [content[i:i + CHUNK] for i in range(0, max(len(content), 1), CHUNK)]


async def one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


class BlobStore(abc.ABC):
    @abc.abstractmethod
    async def put(self, chunks: AsyncIterator[bytes], expected_id: str | None = None) -> BlobInfo: ...

    async def put_bytes(self, data: bytes, expected_id: str | None = None) -> BlobInfo:
        """``put`` of content already in memory."""
        return await self.put(one_chunk(data), expected_id)

    async def store(self, data: bytes) -> BlobInfo:
        """Store content in memory for a mail about to reference it: ``put_bytes`` where the
        caller need not know whether it was a duplicate (a store may then skip the lookup)."""
        return await self.put_bytes(data)

    @abc.abstractmethod
    def get(self, blob_id: str) -> AsyncIterator[bytes]:
        """Stream a blob's bytes in chunks of at most CHUNK."""

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        """The concatenation of whole blobs: only for content known to be small."""
        parts = []
        for blob_id in blob_ids:
            async for chunk in self.get(blob_id):
                parts.append(chunk)
        return b"".join(parts)

    async def read_content(self, blob_ids: tuple[str, ...] | list[str], size: int) -> bytes:
        """``read`` of a mail's content whose total ``size`` is known (a store may then skip a lookup)."""
        return await self.read(blob_ids)

    @abc.abstractmethod
    async def stat(self, blob_id: str) -> BlobInfo: ...

    async def keep(self, blob_id: str) -> BlobInfo:
        """``stat`` of a blob a new mail is about to reference, its write time refreshed when old
        (as a put of equal content does): a retention sweep under way, which read the mails' rows
        before this mail's, then keeps it. NotFound when there is no such blob."""
        return await self.stat(blob_id)

    @abc.abstractmethod
    async def delete(self, blob_id: str) -> bool:
        """Remove a blob; False when it did not exist."""

    @abc.abstractmethod
    async def ping(self) -> None: ...

    async def close(self) -> None:
        return None
