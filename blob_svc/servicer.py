"""BlobService: protobuf <-> domain only; the work is in services/blobstores/ (tiered.py: Cassandra, then S3)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from mailqueue.v1 import blob_pb2, blob_pb2_grpc
from services.ports.blobstore import BlobStore


class BlobServicer(blob_pb2_grpc.BlobServiceServicer):
    def __init__(self, store: Callable[[], BlobStore]) -> None:
        self._store = store  # raises UNAVAILABLE while the service connects

    async def Put(self, request_iterator: AsyncIterator[blob_pb2.PutRequest], context: grpc.aio.ServicerContext) -> blob_pb2.PutResponse:
        store = self._store()
        stream = aiter(request_iterator)
        first = await anext(stream, None)

        async def chunks() -> AsyncIterator[bytes]:
            if first is not None and first.chunk:
                yield first.chunk
            async for request in stream:
                yield request.chunk

        info = await store.put(chunks(), expected_id=first.expected_blob_id if first else None)
        return blob_pb2.PutResponse(blob_id=info.blob_id, size=info.size, deduplicated=info.deduplicated)

    async def PutBytes(self, request: blob_pb2.PutBytesRequest, context: grpc.aio.ServicerContext) -> blob_pb2.PutBytesResponse:
        info = await self._store().put_bytes(request.content, expected_id=request.expected_blob_id or None)
        return blob_pb2.PutBytesResponse(blob_id=info.blob_id, size=info.size, deduplicated=info.deduplicated)

    async def GetBytes(self, request: blob_pb2.GetBytesRequest, context: grpc.aio.ServicerContext) -> blob_pb2.GetBytesResponse:
        return blob_pb2.GetBytesResponse(content=await self._store().read([request.blob_id]))

    async def Get(self, request: blob_pb2.GetRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[blob_pb2.GetResponse]:
        async for chunk in self._store().get(request.blob_id):
            yield blob_pb2.GetResponse(chunk=chunk)

    async def Stat(self, request: blob_pb2.StatRequest, context: grpc.aio.ServicerContext) -> blob_pb2.StatResponse:
        info = await self._store().stat(request.blob_id)
        return blob_pb2.StatResponse(blob_id=info.blob_id, size=info.size)

    async def Delete(self, request: blob_pb2.DeleteRequest, context: grpc.aio.ServicerContext) -> blob_pb2.DeleteResponse:
        return blob_pb2.DeleteResponse(existed=await self._store().delete(request.blob_id))
