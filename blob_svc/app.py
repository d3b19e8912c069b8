"""blob_svc's backends: the small-blob table in Cassandra and the S3 bucket (created at start-up)."""

from __future__ import annotations

from typing import Any

from blob_svc.servicer import BlobServicer
from mailqueue.v1 import blob_pb2_grpc
from services.adapters.cassandra.view import View
from services.adapters.s3.store import S3BlobStore
from services.ports.blobstore import BlobStore
from services.runtime.backends import tiered
from services.runtime.server import App


class BlobApp(App):
    name = "blob"

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._store: BlobStore | None = None
        self._view: View | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(blob_pb2_grpc.add_BlobServiceServicer_to_server, BlobServicer(self.store), "mailqueue.v1.BlobService")]

    async def connect(self) -> None:
        s3 = S3BlobStore(self.settings.s3, self.settings.limits.max_blob_bytes)
        await s3.ensure_bucket()
        view = await View.open(self.settings.cassandra)
        self._view = view
        self._store = tiered(self.settings, view, s3)

    async def check(self) -> None:
        await self.store().ping()

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
        if self._view is not None:
            self._view.close()

    def store(self) -> BlobStore:
        self.require_connected()
        assert self._store is not None
        return self._store
