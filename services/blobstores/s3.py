"""Blob store on S3 (MinIO): the adapter that blob_svc serves.

Puts are spooled to a temporary file while their SHA-256 is computed, so memory stays bounded
whatever the size; the object is then uploaded under its hash (skipped when it already exists).
The minio client is blocking: every call runs in a worker thread. Small puts, the bulk of a
mail queue's, and whole-blob reads skip it and go out from the event loop (s3async.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import urllib3
from minio import Minio
from minio.commonconfig import REPLACE, CopySource

from services import names
from services.blobstore import CHUNK, BlobStore
from services.blobstores import s3errors
from services.blobstores.s3async import AsyncS3, TooLarge
from services.config import S3Settings
from services.errors import BackendUnavailable, InvalidArgument, NotFound, ResourceExhausted
from services.model import BlobInfo
from services.validation import blob_id as check_blob_id

log = logging.getLogger(__name__)

#: Below this size a put is hashed and uploaded from memory instead of a spool file.
IN_MEMORY_PUT = 4 * CHUNK
#: Multipart part size (S3 minimum), uploaded one at a time: what bounds memory on large puts.
UPLOAD_PART = 5 * CHUNK
#: The largest blob ``read`` returns whole (the gRPC message limit); larger ones are streamed with ``get``.
READ_WHOLE_MAX = 16 * CHUNK


_TOUCHED_MAX = 10_000
T = TypeVar("T")


def client(settings: S3Settings) -> Minio:
    """A minio client with a connection pool sized by the settings (shared with the sweep)."""
    http = urllib3.PoolManager(
        maxsize=settings.pool_size,
        timeout=urllib3.Timeout(connect=3, read=30),
        retries=urllib3.Retry(total=2, backoff_factor=0.1, status_forcelist=(500, 502, 503, 504)),
    )
    return Minio(
        settings.endpoint, access_key=settings.access_key, secret_key=settings.secret_key,
        secure=settings.secure, region=settings.region, http_client=http,
    )


class S3BlobStore(BlobStore):
    def __init__(self, settings: S3Settings, max_blob_bytes: int) -> None:
        self._settings = settings
        self._max = max_blob_bytes
        self._client = client(settings)
        self._touched: dict[str, float] = {}
        self._bucket = settings.bucket
        self._s3 = AsyncS3(settings)
        # The minio client blocks: its calls get threads of their own, as many as pooled connections.
        self._executor = concurrent.futures.ThreadPoolExecutor(settings.pool_size, thread_name_prefix="s3")

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        except s3errors.ERRORS as e:
            raise s3errors.to_domain(e) from e

    async def ensure_bucket(self) -> None:
        if not await self._run(self._client.bucket_exists, self._bucket):
            try:
                await self._run(self._client.make_bucket, self._bucket)
            except BackendUnavailable:
                if not await self._run(self._client.bucket_exists, self._bucket):
                    raise
            log.info("created bucket", extra={"bucket": self._bucket})

    async def _exists(self, blob_id: str) -> int | None:
        try:
            st = await self._run(self._client.stat_object, self._bucket, names.blob_key(blob_id))
            return int(st.size)
        except NotFound:
            return None

    def _check_size(self, size: int) -> None:
        if size > self._max:
            raise ResourceExhausted(f"blob exceeds the limit of {self._max} bytes")

    async def put(self, chunks: AsyncIterator[bytes], expected_id: str | None = None) -> BlobInfo:
        if expected_id:
            check_blob_id(expected_id)
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        spool: Any = None
        try:
            async for chunk in chunks:
                size += len(chunk)
                self._check_size(size)
                digest.update(chunk)
                if spool is None and len(buffer) + len(chunk) <= IN_MEMORY_PUT:
                    buffer += chunk
                    continue
                if spool is None:
                    spool = tempfile.NamedTemporaryFile(prefix="blob-", dir=self._settings.spool_dir, delete=False)
                    await asyncio.to_thread(spool.write, bytes(buffer))
                    buffer = bytearray()
                await asyncio.to_thread(spool.write, chunk)
            blob_id = digest.hexdigest()
            if expected_id and expected_id != blob_id:
                raise InvalidArgument(f"content hash {blob_id} differs from the expected blob id {expected_id}")
            key = names.blob_key(blob_id)
            if spool is None:
                return await self._put_small(key, bytes(buffer), blob_id, size)
            existing = await self._exists(blob_id)
            if existing is not None:
                await self._touch(key)
                return BlobInfo(blob_id, existing, deduplicated=True)
            await asyncio.to_thread(spool.flush)
            await self._run(self._client.fput_object, self._bucket, key, spool.name, part_size=UPLOAD_PART, num_parallel_uploads=1)
            return BlobInfo(blob_id, size)
        finally:
            if spool is not None:
                spool.close()
                os.unlink(spool.name)

    async def _put_small(self, key: str, data: bytes, blob_id: str, size: int) -> BlobInfo:
        """Put if absent, else touch. A touch that finds no object (a concurrent copy of the same
        key was replacing it: seen with 16 identical puts at once) puts again, up to 3 times."""
        for attempt in range(3):
            if await self._put_if_absent(key, data, blob_id):
                return BlobInfo(blob_id, size)
            try:
                await self._touch(key)
                return BlobInfo(blob_id, size, deduplicated=True)
            except NotFound:
                if attempt == 2:
                    raise BackendUnavailable("s3", f"blob {blob_id} kept vanishing while it was deduplicated") from None
        raise AssertionError("unreachable")

    async def _put_if_absent(self, key: str, data: bytes, sha256_hex: str) -> bool:
        """One conditional PUT (``If-None-Match: *``): True when created, False when it existed.

        Saves the HEAD request per small blob.
        """
        return await self._on_loop(self._s3.put_if_absent(key, data, sha256_hex))

    async def _on_loop(self, call: Awaitable[T]) -> T:
        """An event-loop S3 call (s3async.py), its errors mapped as ``_run`` maps the minio client's."""
        try:
            return await call
        except s3errors.ERRORS as e:
            raise s3errors.to_domain(e) from e

    async def _touch(self, key: str) -> None:
        """Refresh the modification time of an existing blob that a new mail is about to reference.

        The retention sweep collects only unreferenced blobs last modified before its grace
        period; without the touch, an old blob shared by a mail enqueued during a sweep could be
        collected after the sweep read the rows. A copy onto itself with replaced metadata is a
        metadata-only operation on the server.
        """
        now = time.monotonic()
        last = self._touched.get(key)
        if last is not None and now - last < self._settings.touch_interval_s:
            return
        if len(self._touched) >= _TOUCHED_MAX:
            self._touched.clear()
        self._touched[key] = now  # before the copy: concurrent puts of this blob do not copy it again
        try:
            await self._run(
                self._client.copy_object, self._bucket, key, CopySource(self._bucket, key),
                metadata={"x-amz-meta-touched": str(int(time.time()))}, metadata_directive=REPLACE,
            )
        except BaseException:
            self._touched.pop(key, None)
            raise

    async def get(self, blob_id: str) -> AsyncIterator[bytes]:
        check_blob_id(blob_id)
        response = await self._run(self._client.get_object, self._bucket, names.blob_key(blob_id))
        try:
            while True:
                chunk = await self._run(response.read, CHUNK)
                if not chunk:
                    return
                yield chunk
        finally:
            response.close()
            response.release_conn()

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        parts = []
        for blob_id in blob_ids:
            check_blob_id(blob_id)
            try:
                parts.append(await self._on_loop(self._s3.get(names.blob_key(blob_id), READ_WHOLE_MAX)))
            except TooLarge as e:
                raise ResourceExhausted(
                    f"blob {blob_id} is {e.size} bytes, over the {READ_WHOLE_MAX} bytes read whole: stream it with Get"
                ) from e
        return b"".join(parts)

    async def stat(self, blob_id: str) -> BlobInfo:
        check_blob_id(blob_id)
        size = await self._exists(blob_id)
        if size is None:
            raise NotFound(f"blob {blob_id} not found")
        return BlobInfo(blob_id, size)

    async def delete(self, blob_id: str) -> bool:
        check_blob_id(blob_id)
        if await self._exists(blob_id) is None:
            return False
        await self._run(self._client.remove_object, self._bucket, names.blob_key(blob_id))
        return True

    async def ping(self) -> None:
        await self._run(self._client.bucket_exists, self._bucket)

    async def close(self) -> None:
        await self._s3.close()
