"""Blob store reached through blob_svc over gRPC (what enqueue_svc and dequeue_svc use).

The channel balances over every blob_svc replica (``dns:///blob:50054`` with ``round_robin``).
gRPC statuses are converted back into the domain errors they came from.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc

from mailqueue.v1 import blob_pb2, blob_pb2_grpc
from services.adapters.grpc_channels import bearer, client_channel
from services.domain.errors import BackendUnavailable, CredentialsRefused, InvalidArgument, MailQueueError, NotFound, ResourceExhausted
from services.domain.model import BlobInfo
from services.ports.blobstore import BlobStore

T = TypeVar("T")

_BY_CODE: dict[grpc.StatusCode, type[MailQueueError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
#: The id of the empty blob: what the health check stats to prove the token is accepted.
_EMPTY_BLOB = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _convert(e: grpc.aio.AioRpcError) -> MailQueueError:
    cls = _BY_CODE.get(e.code())
    if cls is not None:
        return cls(e.details() or e.code().name)
    if e.code() in _REFUSED:
        # Our token, not the caller's: the client sees UNAVAILABLE, the operator a message saying what to fix.
        return CredentialsRefused(
            "blob_svc", f"{e.code().name}: {e.details()}; blob_svc refused this service's token: set "
            "MAILQUEUE_SERVICE_TOKEN to a token blob_svc knows (role admin, or producer for enqueue_svc and "
            "consumer for dequeue_svc)"
        )
    return BackendUnavailable("blob_svc", f"{e.code().name}: {e.details()}")


class RemoteBlobStore(BlobStore):
    def __init__(self, target: str, token: str = "", timeout_s: float = 60.0, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channel = client_channel(target, credentials)
        self._metadata = bearer(token)
        self._stub = blob_pb2_grpc.BlobServiceStub(self._channel)
        self._timeout = timeout_s

    async def put(self, chunks: AsyncIterator[bytes], expected_id: str | None = None) -> BlobInfo:
        # Written call by call (not from a request generator) so that an error raised by the
        # source, e.g. a size limit, cancels the upload and reaches the caller as it is. The call
        # has no deadline: the upload goes at its client's pace (100 MiB at 1 MB/s is 100 s, past
        # any fixed one); each step of it (a chunk taken, the answer) is bounded by ``timeout_s``.
        call = self._stub.Put(metadata=self._metadata)
        try:
            first = True
            async for chunk in chunks:
                await self._step(call.write(blob_pb2.PutRequest(chunk=chunk, expected_blob_id=(expected_id or "") if first else "")))
                first = False
            if first:
                await self._step(call.write(blob_pb2.PutRequest(expected_blob_id=expected_id or "")))
            await self._step(call.done_writing())
            r = await self._step(call)
        except grpc.aio.AioRpcError as e:
            raise _convert(e) from e
        except asyncio.InvalidStateError:
            if not call.done():  # not a write to an ended call: the content's source raised it
                call.cancel()
                raise
            # blob_svc ended the Put while chunks were still to go (its limit, a full spool, a
            # restart): a write to an ended call raises this; its status says why.
            raise await self._ended(call) from None
        except BaseException:
            call.cancel()
            raise
        return BlobInfo(r.blob_id, r.size, r.deduplicated)

    async def _ended(self, call: grpc.aio.StreamUnaryCall) -> MailQueueError:
        try:
            await self._step(call)
        except grpc.aio.AioRpcError as e:
            return _convert(e)
        return BackendUnavailable("blob_svc", "blob_svc answered a Put before its content was sent")

    async def _step(self, step: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._timeout):
                return await step
        except TimeoutError:
            raise BackendUnavailable("blob_svc", f"a Put made no progress within {self._timeout:g} s") from None

    async def put_bytes(self, data: bytes, expected_id: str | None = None) -> BlobInfo:
        try:
            r = await self._stub.PutBytes(
                blob_pb2.PutBytesRequest(content=data, expected_blob_id=expected_id or ""),
                timeout=self._timeout, metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as e:
            raise _convert(e) from e
        return BlobInfo(r.blob_id, r.size, r.deduplicated)

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        parts = []
        for blob_id in blob_ids:
            try:
                r = await self._stub.GetBytes(
                    blob_pb2.GetBytesRequest(blob_id=blob_id), timeout=self._timeout, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as e:
                raise _convert(e) from e
            parts.append(r.content)
        return b"".join(parts)

    async def get(self, blob_id: str) -> AsyncIterator[bytes]:
        try:
            async for r in self._stub.Get(blob_pb2.GetRequest(blob_id=blob_id), timeout=self._timeout, metadata=self._metadata):
                yield r.chunk
        except grpc.aio.AioRpcError as e:
            raise _convert(e) from e

    async def stat(self, blob_id: str) -> BlobInfo:
        try:
            r = await self._stub.Stat(blob_pb2.StatRequest(blob_id=blob_id), timeout=self._timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise _convert(e) from e
        return BlobInfo(r.blob_id, r.size)

    async def delete(self, blob_id: str) -> bool:
        try:
            r = await self._stub.Delete(blob_pb2.DeleteRequest(blob_id=blob_id), timeout=self._timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise _convert(e) from e
        return r.existed

    async def ping(self) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            r = await health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError as e:
            raise BackendUnavailable("blob_svc", f"{e.code().name}: {e.details()}") from e
        if r.status != health_pb2.HealthCheckResponse.SERVING:
            raise BackendUnavailable("blob_svc", "not serving")
        # Health is open to everyone: an authenticated call shows whether blob_svc accepts our token.
        try:
            await self._stub.Stat(blob_pb2.StatRequest(blob_id=_EMPTY_BLOB), timeout=3, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise _convert(e) from e

    async def close(self) -> None:
        await self._channel.close()
