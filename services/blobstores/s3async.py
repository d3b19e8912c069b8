"""Small-object PUT and GET on S3 from the event loop: the hot paths without a thread hand-off.

The minio client blocks, so every call costs a worker-thread hand-off plus urllib3 and
http.client header parsing: about 1 ms of CPU per 10 KiB put on the 2-core reference machine,
more than the gRPC hop that carries the mail. Small blobs are the bulk of a mail queue's traffic,
so they go out here: pooled keep-alive HTTP/1.1 connections on asyncio streams, signed by the
minio client's own SigV4 signer (a put's payload hash is the blob id it already computed).
Everything else (multipart uploads, streamed gets, stat, delete, bucket checks) stays on the
minio client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import ssl
from urllib.parse import quote, urlsplit

from minio.credentials import Credentials
from minio.signer import sign_v4_s3
from minio.time import to_amz_date

from services.config import S3Settings
from services.retry import Backoff, retrying

#: Seconds to connect, and to send a put and read its answer.
CONNECT_TIMEOUT_S = 3.0
EXCHANGE_TIMEOUT_S = 30.0
#: A 5xx answer is tried again (S3 asks clients to retry those: SlowDown, InternalError).
SERVER_ERROR_BACKOFF = Backoff("S3 request", initial_s=0.1, multiplier=2.0, max_s=1.0, attempts=3)
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")


class S3ResponseError(Exception):
    """S3 answered with an error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


class TooLarge(Exception):
    """A GET whose object is over the caller's limit (nothing was read)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"object is {size} bytes")
        self.size = size


class _ServerError(Exception):
    """A 5xx answer: retried, then returned as it is."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


class _Stale(Exception):
    """A pooled connection the server had closed: retried once on a fresh one."""


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AsyncS3:
    def __init__(self, settings: S3Settings) -> None:
        host, _, port = settings.endpoint.rpartition(":")
        self._host = host or settings.endpoint
        self._port = int(port) if host else (443 if settings.secure else 80)
        self._endpoint = settings.endpoint
        self._scheme = "https" if settings.secure else "http"
        self._ssl = ssl.create_default_context() if settings.secure else None
        self._bucket = settings.bucket
        self._region = settings.region or "us-east-1"
        self._credentials = Credentials(settings.access_key, settings.secret_key)
        self._slots = asyncio.Semaphore(settings.pool_size)
        self._idle: list[_Conn] = []

    async def put_if_absent(self, key: str, data: bytes, sha256_hex: str) -> bool:
        """PUT with ``If-None-Match: *``: True when created, False when the key existed.

        Raises S3ResponseError for an error answer and OSError/TimeoutError when S3 is unreachable.
        """
        status, body = await self._request(
            "PUT", key, {"Content-Type": "application/octet-stream", "If-None-Match": "*"}, data, sha256_hex
        )
        if status == 412:
            return False
        _raise_for(status, body)
        return True

    async def get(self, key: str, max_bytes: int) -> bytes:
        """A whole object; TooLarge when it is over ``max_bytes``, S3ResponseError (``NoSuchKey``) when missing."""
        status, body = await self._request("GET", key, {}, b"", _EMPTY_SHA256, max_bytes)
        _raise_for(status, body)
        return body

    async def _request(
        self, method: str, key: str, extra: dict[str, str], payload: bytes, sha256_hex: str, max_bytes: int = 1 << 20
    ) -> tuple[int, bytes]:
        path = f"/{self._bucket}/{quote(key)}"
        now = dt.datetime.now(dt.timezone.utc)
        headers = sign_v4_s3(
            method=method, url=urlsplit(f"{self._scheme}://{self._endpoint}{path}"), region=self._region,
            headers={
                "Host": self._endpoint, "Content-Length": str(len(payload)), **extra,
                "x-amz-content-sha256": sha256_hex, "x-amz-date": to_amz_date(now),
            },
            credentials=self._credentials, content_sha256=sha256_hex, date=now,
        )
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + payload

        async def attempt() -> tuple[int, bytes]:
            status, body = await self._send(request, max_bytes)
            if status >= 500:
                raise _ServerError(status, body)
            return status, body

        try:
            return await retrying(attempt, SERVER_ERROR_BACKOFF, (_ServerError,))
        except _ServerError as e:
            return e.status, e.body

    async def _send(self, request: bytes, max_bytes: int) -> tuple[int, bytes]:
        async with self._slots:
            if self._idle:
                conn = self._idle.pop()
                try:
                    return await self._exchange(conn, request, max_bytes)
                except _Stale:
                    pass  # the server closed an idle connection: once more on a fresh one
            conn = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port, ssl=self._ssl), CONNECT_TIMEOUT_S
            )
            try:
                return await self._exchange(conn, request, max_bytes)
            except _Stale as e:
                raise ConnectionResetError("S3 closed the connection without answering") from e

    async def _exchange(self, conn: _Conn, request: bytes, max_bytes: int) -> tuple[int, bytes]:
        reader, writer = conn
        keep = False
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT_S):
                try:
                    writer.write(request)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as e:
                    raise _Stale() from e
                status, length, chunked, reusable = _parse_head(head)
                if length > max_bytes:
                    raise TooLarge(length)
                body = await (_read_chunked(reader) if chunked else reader.readexactly(length))
                keep = reusable
        finally:
            if keep:
                self._idle.append(conn)
            else:
                writer.close()
        return status, body

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


def _raise_for(status: int, body: bytes) -> None:
    if status // 100 == 2:
        return
    code = _CODE.search(body)
    message = _MESSAGE.search(body)
    raise S3ResponseError(status, code.group(1).decode() if code else "", message.group(1).decode() if message else "")


def _parse_head(head: bytes) -> tuple[int, int, bool, bool]:
    """(status, content length, chunked, keep-alive) of an HTTP/1.1 response head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ConnectionResetError(f"not an HTTP response from S3: {lines[0][:80]!r}")
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    chunked = "chunked" in fields.get("transfer-encoding", "").lower()
    keep = fields.get("connection", "").lower() != "close" and (chunked or "content-length" in fields)
    return int(parts[1]), int(fields.get("content-length", "0")), chunked, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (S3 sends no trailers)."""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return bytes(body)
        body += data[:-2]
