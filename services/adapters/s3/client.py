"""The one S3 client of the project: obstore (Rust object_store) for blob_svc, the sweep and the benches.

It signs, pools HTTP connections, retries 5xx answers and dropped connections with jittered
backoff, and does conditional puts and multipart uploads. blob_svc awaits its asyncio calls on
the event loop (s3.py); the sweep's Spark tasks and the benches use its blocking calls.

One workaround: obstore completes an asyncio future from a tokio thread with
``call_soon_threadsafe``, which releases the GIL while it wakes the loop. When the program ends
right then, the thread takes the GIL back during interpreter shutdown and Python 3.11 aborts the
process (SIGABRT at exit in 8 of 60 runs of a script that saw two S3 errors; gdb: a tokio worker
in ``sock_send`` -> ``take_gil`` -> ``PyThread_exit_thread``). ``_let_threads_leave`` gives such a
thread 50 ms at exit to leave Python first (0 of 60, then 0 of 100 runs, with it).

Object store has no bucket API: ``create_bucket`` sends the one CreateBucket request, signed by
obstore (a presigned PUT on the bucket's root).
"""

from __future__ import annotations

import atexit
import datetime as dt
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import obstore
from obstore.store import S3Store

from services.domain.config import S3Settings

#: Retries of a failed request (5xx, reset connection, timeout of a read-only request), and the
#: time after which none is tried: an S3 outage is reported in seconds, not minutes.
RETRIES = 2
RETRY_WITHIN = dt.timedelta(seconds=5)
CONNECT_TIMEOUT = dt.timedelta(seconds=3)
REQUEST_TIMEOUT = dt.timedelta(seconds=30)
#: Text of obstore's error when the bucket itself is missing (a list answers 404 NoSuchBucket).
NO_SUCH_BUCKET = "NoSuchBucket"
#: What a tokio thread gets at exit to leave ``call_soon_threadsafe`` (see above).
EXIT_GRACE_S = 0.05


@atexit.register
def _let_threads_leave() -> None:
    time.sleep(EXIT_GRACE_S)


def store(settings: S3Settings) -> S3Store:
    """A client of the settings' bucket (path-style requests, as MinIO serves them)."""
    scheme = "https" if settings.secure else "http"
    return S3Store(
        settings.bucket,
        endpoint=f"{scheme}://{settings.endpoint}",
        access_key_id=settings.access_key,
        secret_access_key=settings.secret_key,
        region=settings.region or "us-east-1",
        virtual_hosted_style_request=False,
        # Over plain HTTP the signature covers the payload's SHA-256, so S3 refuses a body damaged
        # on the way; over TLS the transport does that and the second hash is skipped (as botocore).
        unsigned_payload=settings.secure,
        client_options={
            "allow_http": not settings.secure,
            "connect_timeout": CONNECT_TIMEOUT,
            "timeout": REQUEST_TIMEOUT,
            "pool_max_idle_per_host": str(settings.pool_size),
        },
        retry_config={
            "max_retries": RETRIES,
            "retry_timeout": RETRY_WITHIN,
            "backoff": {"init_backoff": dt.timedelta(milliseconds=100), "max_backoff": dt.timedelta(seconds=1), "base": 2},
        },
    )


def bucket_exists(client: S3Store) -> bool:
    """True when the bucket answers a one-key listing; False when S3 says it does not exist."""
    try:
        for _ in obstore.list(client, prefix="mailqueue-owner", chunk_size=1):
            break
    except obstore.exceptions.BaseError as e:
        if NO_SUCH_BUCKET in str(e):
            return False
        raise
    return True


def objects(client: S3Store, prefix: str) -> Iterator[dict[str, Any]]:
    """Every object whose key starts with ``prefix`` (and is longer than it): dicts with ``path``,
    ``size`` and ``last_modified``, in key order.

    object_store matches prefixes by whole path segments (``blobs/0a`` would mean ``blobs/0a/``),
    so this lists the prefix's folder from the prefix on (S3's start-after) and stops at the first
    key past it: a listing of ``blobs/0a`` reads only the keys that start with it.
    """
    folder = prefix.rpartition("/")[0] or None
    for chunk in obstore.list(client, prefix=folder, offset=prefix or None, chunk_size=1000):
        for o in chunk:
            if not o["path"].startswith(prefix):
                return
            yield o


def create_bucket(client: S3Store, settings: S3Settings) -> None:
    """CreateBucket; a bucket created meanwhile (another replica) is not an error."""
    url = obstore.sign(client, "PUT", "", dt.timedelta(minutes=1))
    region = settings.region or "us-east-1"
    body = None if region == "us-east-1" else (
        "<CreateBucketConfiguration><LocationConstraint>"
        f"{region}</LocationConstraint></CreateBucketConfiguration>"
    ).encode()
    request = urllib.request.Request(url, data=body, method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT.total_seconds()):
            return
    except urllib.error.HTTPError as e:
        answer = e.read().decode(errors="replace")
        if e.code == 409 and "BucketAlreadyOwnedByYou" in answer:
            return
        raise OSError(f"CreateBucket {settings.bucket} answered HTTP {e.code}: {answer[:300]}") from e


def delete_bucket(client: S3Store) -> None:
    """Every object, then the bucket itself (benches and tests clean up with it)."""
    keys = [o["path"] for o in objects(client, "")]
    for i in range(0, len(keys), 1000):
        obstore.delete(client, keys[i:i + 1000])
    request = urllib.request.Request(obstore.sign(client, "DELETE", "", dt.timedelta(minutes=1)), method="DELETE")
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT.total_seconds()):
        pass
