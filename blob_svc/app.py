"""blob_svc's backends: the small-blob table in Cassandra and the S3 bucket (created at start-up)."""

from __future__ import annotations

from typing import Any

from blob_svc.servicer import BlobServicer
from mailqueue.v1 import blob_pb2_grpc
from services.ports.blobstore import BlobStore
from services.runtime.backends import BlobBackends
from services.runtime.server import App


class BlobApp(App):
    name = "blob"
    #: A Put or Get of a large blob from a slow client outlives the default 30 s after its
    #: connection's maximum age (1 GiB at 4 MB/s: 270 s).
    connection_age_grace_s = 300.0

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        self._backends: BlobBackends | None = None

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(blob_pb2_grpc.add_BlobServiceServicer_to_server, BlobServicer(self.store), "mailqueue.v1.BlobService")]

    async def connect(self) -> None:
        self._backends = await BlobBackends.open(self.settings)

    async def check(self) -> None:
        await self.store().ping()

    async def close(self) -> None:
        if self._backends is not None:
            await self._backends.close()

    def store(self) -> BlobStore:
        self.require_connected()
        assert self._backends is not None
        return self._backends.store
