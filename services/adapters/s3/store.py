"""Blob store on S3 (MinIO): the adapter that blob_svc serves.

Every S3 call goes through the minio SDK (client.py), blocking, on a thread pool of its own with
one thread per pooled connection, awaited from the event loop. Puts are hashed as they arrive
(the SHA-256 is the blob id); up to IN_MEMORY_PUT they are one conditional PUT (``If-None-Match:
*``), larger ones are spooled to a temporary file, so memory stays bounded whatever the size, and
uploaded in parts unless the blob already exists. Reads stream the body chunk by chunk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import functools
import glob
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from services.adapters.s3 import client as s3client
from services.adapters.s3 import errors as s3errors
from services.adapters.s3.settings import S3Settings
from services.domain import names
from services.domain.errors import BackendUnavailable, InvalidArgument, NotFound, ResourceExhausted
from services.domain.model import BlobInfo
from services.domain.validation import blob_id as check_blob_id
from services.ports.blobstore import CHUNK, BlobStore

log = logging.getLogger(__name__)

#: Below this size a put is hashed and uploaded from memory instead of a spool file.
IN_MEMORY_PUT = 4 * CHUNK
#: The largest blob ``read`` returns whole (the gRPC message limit, less the answer's own framing:
#: a blob of 16 MiB less 4 bytes made an answer over it); larger ones are streamed with ``get``.
READ_WHOLE_MAX = 16 * CHUNK - 64

_TOUCHED_MAX = 10_000
T = TypeVar("T")
#: A spool file this much older than its last write is a Put's that never ended (its process
#: killed mid-Put: ``delete=False``'s file outlives it); removed at start-up.
SPOOL_LEFTOVER_S = 3600.0
#: A spool file's name starts so (in a folder it may share: the system's temporary one).
SPOOL_PREFIX = "mailqueue-blob-"


def clear_spool(folder: str | None, now: float | None = None) -> int:
    """Remove the spool files of Puts that never ended (another worker's Put under way writes its
    own every few milliseconds: kept); how many were removed."""
    folder = folder or tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = 0
    for path in glob.glob(os.path.join(glob.escape(folder), f"{SPOOL_PREFIX}*")):
        try:
            if now - os.stat(path).st_mtime > SPOOL_LEFTOVER_S:
                os.unlink(path)
                removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    if removed:
        log.warning("removed the spool files of Puts that never ended (a process killed mid-Put)",
                    extra={"folder": folder, "files": removed})
    return removed


class S3BlobStore(BlobStore):
    def __init__(self, settings: S3Settings, max_blob_bytes: int) -> None:
        self._settings = settings
        self._max = max_blob_bytes
        self._bucket = s3client.Bucket(settings)
        self._pool = concurrent.futures.ThreadPoolExecutor(settings.pool_size, thread_name_prefix="s3")
        self._touched: dict[str, float] = {}
        clear_spool(settings.spool_dir)
        #: Whether ``ensure_bucket`` has run to its end (else the next ``ping`` runs it).
        self._bucket_checked = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the S3 threads, its errors mapped to the domain's."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))
        except s3errors.ERRORS as e:
            raise s3errors.to_domain(e) from e

    async def _spool(self, fn: Callable[..., T], *args: Any) -> T:
        """A write to a Put's spool file, on the S3 threads: a full disk is the spool folder's, not S3's."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))
        except OSError as e:
            raise self._spool_unavailable(e) from e

    def _spool_unavailable(self, e: OSError) -> BackendUnavailable:
        return BackendUnavailable("blob spool", f"{e.strerror or e}: the spool folder ({self._settings.spool_dir or tempfile.gettempdir()}, "
                                  "MAILQUEUE_SPOOL_DIR) cannot hold this Put: check it exists and is writable, give it more "
                                  "room (Kubernetes: the emptyDir's sizeLimit), or make fewer large Puts at once")

    async def ensure_bucket(self) -> None:
        """Create the bucket when S3 says it does not exist (a first start)."""
        try:
            if await self._call(self._bucket.exists):
                self._bucket_checked = True
                return
        except BackendUnavailable as e:
            if "AccessDenied" not in e.detail:
                raise
            # A least-privilege user (puts and gets only) may not look at the bucket: the
            # operator's provisioning made it (stack/provision.py, the Kubernetes Secrets' user).
            log.info("may not check the bucket (no s3:ListBucket): taken as provisioned", extra={"bucket": self._settings.bucket})
            self._bucket_checked = True
            return
        await self._call(self._bucket.create)
        self._bucket_checked = True
        log.info("created bucket", extra={"bucket": self._settings.bucket})

    async def _head(self, blob_id: str) -> s3client.Object | None:
        try:
            return await self._call(self._bucket.head, names.blob_key(blob_id))
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
                    try:  # here, not on the S3 threads: a Put cancelled meanwhile would leave the file
                        spool = tempfile.NamedTemporaryFile(prefix=SPOOL_PREFIX, dir=self._settings.spool_dir, delete=False)
                    except OSError as e:
                        raise self._spool_unavailable(e) from e
                    await self._spool(spool.write, bytes(buffer))
                    buffer = bytearray()
                await self._spool(spool.write, chunk)
            blob_id = digest.hexdigest()
            if expected_id and expected_id != blob_id:
                raise InvalidArgument(f"content hash {blob_id} differs from the expected blob id {expected_id}")
            key = names.blob_key(blob_id)
            if spool is None:
                data = bytes(buffer)
                if await self._call(self._bucket.put_if_absent, key, data):
                    return BlobInfo(blob_id, size)
                if await self._kept(key):
                    return BlobInfo(blob_id, size, deduplicated=True)
                await self._call(self._bucket.put_if_absent, key, data)  # the sweep removed it meanwhile
                return BlobInfo(blob_id, size)
            await self._spool(spool.flush)
            existing = await self._head(blob_id)
            if existing is not None and (_age_s(existing) < self._settings.touch_interval_s or await self._kept(key)):
                return BlobInfo(blob_id, existing.size, deduplicated=True)
            await self._call(self._bucket.upload, key, spool.name, size)
            return BlobInfo(blob_id, size)
        finally:
            if spool is not None:
                # A full disk may fail the close's flush of bytes a failed write left buffered:
                # that error must not replace the UNAVAILABLE said already. The file goes anyway.
                try:
                    spool.close()
                    os.unlink(spool.name)
                except OSError as e:  # logged, never in place of what the Put said
                    if not isinstance(e, FileNotFoundError):
                        log.warning("could not remove a Put's spool file (the next start removes it): %s", e,
                                    extra={"spool_file": spool.name})
                    with contextlib.suppress(OSError):
                        os.unlink(spool.name)

    async def put_bytes(self, data: bytes, expected_id: str | None = None) -> BlobInfo:
        """Content already in memory (an inline enqueue): hashed and put in one trip to the S3
        threads, with no copy (hashlib releases the GIL: the event loop runs meanwhile). A 100 KB
        enqueue through ``put``'s one-chunk stream hashed on the loop and copied twice."""
        if len(data) > IN_MEMORY_PUT:
            return await super().put_bytes(data, expected_id)
        if expected_id:
            check_blob_id(expected_id)
        self._check_size(len(data))
        blob_id, created = await self._call(self._hash_and_put, data, expected_id)
        if created is None:
            raise InvalidArgument(f"content hash {blob_id} differs from the expected blob id {expected_id}")
        if not created and not await self._kept(names.blob_key(blob_id)):
            await self._call(self._bucket.put_if_absent, names.blob_key(blob_id), data)  # the sweep removed it meanwhile
            created = True
        return BlobInfo(blob_id, len(data), deduplicated=not created)

    def _hash_and_put(self, data: bytes, expected_id: str | None) -> tuple[str, bool | None]:
        """(blob id, created); created is None when the content is not ``expected_id``'s."""
        blob_id = hashlib.sha256(data).hexdigest()
        if expected_id and expected_id != blob_id:
            return blob_id, None
        return blob_id, self._bucket.put_if_absent(names.blob_key(blob_id), data)

    async def keep(self, blob_id: str) -> BlobInfo:
        head = await self._found(blob_id)
        if _age_s(head) >= self._settings.touch_interval_s:
            await self._touch(names.blob_key(blob_id))
        return BlobInfo(blob_id, head.size)

    async def _kept(self, key: str) -> bool:
        """``_touch``; False when the object is gone (the retention sweep removed it between the
        write that found it and the touch): the caller writes the content again."""
        try:
            await self._touch(key)
        except NotFound:
            return False
        return True

    async def _touch(self, key: str) -> None:
        """Refresh the modification time of an existing blob that a new mail is about to reference.

        The retention sweep collects only unreferenced blobs last modified before its grace
        period; without the touch, an old blob shared by a mail enqueued during a sweep could be
        collected after the sweep read the rows. A server-side copy onto itself (no bytes sent),
        at most once per ``touch_interval_s`` per key and process.
        """
        now = time.monotonic()
        last = self._touched.get(key)
        if last is not None and now - last < self._settings.touch_interval_s:
            return
        if len(self._touched) >= _TOUCHED_MAX:
            self._touched.clear()
        self._touched[key] = now  # before the write: concurrent puts of this blob do not touch it again
        try:
            await self._call(self._bucket.touch, key)
        except BaseException:
            self._touched.pop(key, None)
            raise

    async def get(self, blob_id: str) -> AsyncIterator[bytes]:
        check_blob_id(blob_id)
        response = await self._call(self._bucket.open, names.blob_key(blob_id))
        reading = False
        try:
            while True:
                reading = True
                chunk = await self._call(response.read, CHUNK)
                reading = False
                if not chunk:
                    return
                yield chunk
        finally:
            if reading:  # the caller left while an S3 thread reads: see _let_go
                _let_go(response, self._pool)
            else:
                response.close()
                response.release_conn()

    async def read(self, blob_ids: tuple[str, ...] | list[str]) -> bytes:
        parts = []
        for blob_id in blob_ids:
            check_blob_id(blob_id)
            data = await self._call(self._bucket.read, names.blob_key(blob_id), READ_WHOLE_MAX + 1)
            if len(data) > READ_WHOLE_MAX:
                raise ResourceExhausted(f"blob {blob_id} is over the {READ_WHOLE_MAX} bytes read whole: stream it with Get")
            parts.append(data)
        return b"".join(parts)

    async def stat(self, blob_id: str) -> BlobInfo:
        return BlobInfo(blob_id, (await self._found(blob_id)).size)

    async def _found(self, blob_id: str) -> s3client.Object:
        check_blob_id(blob_id)
        head = await self._head(blob_id)
        if head is None:
            raise NotFound(f"blob {blob_id} not found")
        return head

    async def delete(self, blob_id: str) -> bool:
        check_blob_id(blob_id)
        if await self._head(blob_id) is None:
            return False
        await self._call(self._bucket.remove, names.blob_key(blob_id))
        return True

    async def ping(self) -> None:
        if not self._bucket_checked:  # S3 did not answer at start-up: the bucket is made sure of now
            await self.ensure_bucket()
        if not await self._call(self._bucket.located):
            raise BackendUnavailable("s3", f"bucket {self._settings.bucket} does not exist: create it (MAILQUEUE_S3_BUCKET) "
                                           "with the S3 admin")

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _age_s(head: s3client.Object) -> float:
    return (dt.datetime.now(dt.timezone.utc) - head.last_modified).total_seconds()


def _let_go(response: Any, pool: concurrent.futures.Executor) -> None:
    """End a Get's S3 response whose read is still running on an S3 thread (the caller left:
    cancelled, its deadline passed). ``close`` would wait, on the event loop, for the lock that
    read holds, until S3 sends more or the read times out (READ_TIMEOUT_S): every call of the
    process stalled while S3 is slow. The socket is shut for reading, which ends the read at
    once, and the close runs on the S3 threads; the connection is not reused."""
    with contextlib.suppress(ValueError, RuntimeError, OSError):  # no socket, or released already
        response.shutdown()
    with contextlib.suppress(RuntimeError):  # the pool shut down (the process stops): the socket goes with it
        pool.submit(_closed, response)


def _closed(response: Any) -> None:
    with contextlib.suppress(Exception):
        response.close()
        response.release_conn()
