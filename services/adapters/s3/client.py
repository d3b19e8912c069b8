"""The one S3 client of the project: the ``minio`` SDK, for blob_svc, the sweep, the benches and tests.

``Bucket`` is the bucket as every caller uses it, with blocking calls (blob_svc runs them on its
own thread pool, services/adapters/s3/store.py; the sweep's Spark tasks and the benches call
them directly). What it decides once for everyone:

- **Connections**: one urllib3 pool per client, ``pool_size`` connections kept per host (the
  thread pool that calls it has as many threads, so no call waits for a connection).
- **Retries**: urllib3's, in one place: a 5xx answer, a refused or reset connection or a read
  timeout is retried twice with a growing pause (0.1 s, 0.2 s), for the idempotent requests
  (GET, HEAD, PUT, DELETE; never the POST that completes a multipart upload); then the error
  reaches the caller, which maps it (services/adapters/s3/errors.py). An S3 outage is reported
  in seconds: connect timeout 3 s, read timeout 30 s.
- **Region**: given (default ``us-east-1``), so no request asks S3 for the bucket's location.
- **Payload signing**: over plain HTTP the signature covers the payload's SHA-256 (S3 refuses a
  body damaged on the way); over TLS the transport does that (the SDK sends UNSIGNED-PAYLOAD).
- **Whole reads** are one ranged GET; **puts of content already in memory** are one PUT, with
  ``If-None-Match: *`` when the caller needs to know whether it existed (no HEAD first).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import os
from collections.abc import Iterator

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import REPLACE, CopySource
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from services.adapters.s3.settings import S3Settings

#: Retries of a failed idempotent request, and the pause before the first (doubling).
RETRIES = 2
BACKOFF_S = 0.1
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 30.0
#: Multipart part size (the S3 minimum): parts are read and sent one at a time, what bounds the
#: memory of a large upload.
UPLOAD_PART = 5 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Object:
    key: str
    size: int
    last_modified: dt.datetime


def http_client(settings: S3Settings) -> urllib3.PoolManager:
    return urllib3.PoolManager(
        maxsize=settings.pool_size,
        timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        retries=urllib3.Retry(
            total=RETRIES, backoff_factor=BACKOFF_S, status_forcelist=(500, 502, 503, 504), raise_on_status=False,
        ),
        cert_reqs="CERT_REQUIRED" if settings.secure else "CERT_NONE",
        ca_certs=settings.ca_file or os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )


class Bucket:
    """The settings' bucket (path-style requests, as MinIO serves them)."""

    def __init__(self, settings: S3Settings) -> None:
        self.name = settings.bucket
        self.region = settings.region or "us-east-1"
        self.client = Minio(settings.endpoint, access_key=settings.access_key, secret_key=settings.secret_key,
                            secure=settings.secure, region=self.region, http_client=http_client(settings))

    # The bucket itself.

    def exists(self) -> bool:
        return self.client.bucket_exists(self.name)

    def located(self) -> bool:
        """GetBucketLocation: the bucket exists and these credentials are good. The check of a
        least-privilege user, which may put or get blobs but not list the bucket (HeadBucket needs
        s3:ListBucket; s3:GetBucketLocation reveals nothing). False when the bucket is missing."""
        try:
            self.client._url_open("GET", self.region, bucket_name=self.name, query_params={"location": ""})  # noqa: SLF001
            return True
        except S3Error as e:
            if e.code == "NoSuchBucket":
                return False
            raise

    def create(self) -> None:
        """CreateBucket; a bucket created meanwhile (another replica) is not an error."""
        try:
            self.client.make_bucket(self.name, location=self.region)
        except S3Error as e:
            if e.code != "BucketAlreadyOwnedByYou":
                raise

    def drop(self) -> None:
        """Every object, then the bucket (benches and tests clean up with it)."""
        keys = [DeleteObject(o.key) for o in self.objects("")]
        for error in self.client.remove_objects(self.name, keys):
            raise OSError(f"could not delete {error.name}: {error.message}")
        self.client.remove_bucket(self.name)

    # Objects.

    def objects(self, prefix: str) -> Iterator[Object]:
        """Every object whose key starts with ``prefix``, in key order (paged by the SDK)."""
        for o in self.client.list_objects(self.name, prefix=prefix or None, recursive=True):
            yield Object(o.object_name, int(o.size or 0), o.last_modified)

    def head(self, key: str) -> Object:
        st = self.client.stat_object(self.name, key)
        return Object(key, int(st.size or 0), st.last_modified)

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(self.name, key, io.BytesIO(data), len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """One conditional PUT: True when created, False when the key existed.

        The SDK's put_object turns every extra header into user metadata, so the conditional
        header goes through its PutObject call itself (minio is pinned in constraints.txt;
        tests/unit/test_s3client.py checks the call is there)."""
        try:
            self.client._put_object(self.name, key, data, headers={"If-None-Match": "*"})  # noqa: SLF001
            return True
        except S3Error as e:
            if e.code == "PreconditionFailed" or e.response.status == 412:
                return False
            raise

    def upload(self, key: str, path: str, size: int) -> None:
        """A file as one object: parts of UPLOAD_PART, one at a time."""
        with open(path, "rb") as f:
            self.client.put_object(self.name, key, f, size, part_size=UPLOAD_PART, num_parallel_uploads=1)

    def touch(self, key: str) -> None:
        """A new modification time for an existing object, without sending its bytes again (a
        server-side copy onto itself that replaces its metadata)."""
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.client.copy_object(self.name, key, CopySource(self.name, key), metadata={"x-amz-meta-touched": now},
                                metadata_directive=REPLACE)

    def read(self, key: str, limit: int) -> bytes:
        """Up to ``limit`` bytes from the start, in one ranged GET (an empty object: one plain GET)."""
        try:
            response = self.client.get_object(self.name, key, offset=0, length=limit)
        except S3Error as e:
            if e.code != "InvalidRange":
                raise
            response = self.client.get_object(self.name, key)
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def open(self, key: str) -> urllib3.BaseHTTPResponse:
        """The object's body as a stream: read it, then ``close`` and ``release_conn``."""
        return self.client.get_object(self.name, key)

    def remove(self, key: str) -> None:
        self.client.remove_object(self.name, key)
