"""The blob bucket as the sweep sees it: reachable, and owned by the keyspace being swept.

Blob collection deletes every blob that no row of *this* keyspace references, so a bucket
shared by two deployments (two keyspaces) would lose the other one's mail. The first sweep
that collects blobs writes the keyspace's name into ``mailqueue-owner`` at the bucket's root;
a sweep of another keyspace then refuses to collect from it.
"""

from __future__ import annotations

from services.adapters.s3 import client as s3client
from services.adapters.s3 import errors as s3errors
from services.adapters.s3.settings import S3Settings
from services.domain.errors import BackendUnavailable

OWNER_KEY = "mailqueue-owner"
#: Text in a Spark failure that means a backend, not the job, is at fault.
UNREACHABLE_MARKERS = ("NoHostAvailable", "AllNodesFailedException", "Connection refused", "MaxRetryError", "unavailable")


class BucketOwnedElsewhere(RuntimeError):
    pass


def ping(s3: S3Settings) -> None:
    try:
        s3client.Bucket(s3).exists()
    except s3errors.ERRORS as e:
        raise BackendUnavailable("s3", f"cannot reach {s3.endpoint} ({type(e).__name__}: {e})") from e


def usable(s3: S3Settings, keyspace: str, claim: bool) -> bool:
    """True when blobs may be collected from the bucket (False: there is no bucket yet)."""
    bucket = s3client.Bucket(s3)
    if not bucket.exists():
        return False
    try:
        owner = bucket.read(OWNER_KEY, 1000).decode().strip()
    except s3errors.ERRORS as e:
        if not s3errors.is_missing(e):
            raise
        if claim:
            bucket.put(OWNER_KEY, keyspace.encode())
        return True
    if owner != keyspace:
        raise BucketOwnedElsewhere(
            f"bucket {s3.bucket} holds the blobs of keyspace {owner!r}, not {keyspace!r}: collecting them "
            "would delete that deployment's mail. Give each deployment its own MAILQUEUE_S3_BUCKET."
        )
    return True
