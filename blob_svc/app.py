"""blob_svc's backends: the S3 bucket (created at start-up)."""

from __future__ import annotations

from typing import Any

from mailqueue.v1 import blob_pb2_grpc
from blob_svc.servicer import BlobServicer
from services.blobstores.s3 import S3BlobStore
from services.runtime.server import App


class BlobApp(App):
    name = "blob"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._store: S3BlobStore | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(blob_pb2_grpc.add_BlobServiceServicer_to_server, BlobServicer(self), "mailqueue.v1.BlobService")]

    async def connect(self) -> None:
        store = S3BlobStore(self.settings.s3, self.settings.limits.max_blob_bytes)
        await store.ensure_bucket()
        self._store = store

    async def check(self) -> None:
        await self.store().ping()

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()

    def store(self) -> S3BlobStore:
        self.require_connected()
        assert self._store is not None
        return self._store
