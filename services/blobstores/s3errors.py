"""What an S3 failure means to the mail queue, decided once for every S3 caller.

Both S3 clients (the minio client and the event-loop one in s3async.py) and the retention
sweep's tasks map their errors here: a missing object is NotFound, anything else (an error
answer, a refused or reset connection, a timeout) means S3 is unavailable.
"""

from __future__ import annotations

import urllib3
from minio.error import S3Error

from services.blobstores.s3async import S3ResponseError
from services.errors import BackendUnavailable, MailQueueError, NotFound

#: S3 error codes that mean "no such object" (NoSuchBucket: the whole bucket is gone).
MISSING = frozenset({"NoSuchKey", "NoSuchObject", "NoSuchBucket"})
#: Exceptions raised by the S3 clients, mapped by ``to_domain``.
ERRORS: tuple[type[BaseException], ...] = (S3Error, S3ResponseError, urllib3.exceptions.HTTPError, OSError, TimeoutError)


def is_missing(e: BaseException) -> bool:
    return isinstance(e, (S3Error, S3ResponseError)) and e.code in MISSING


def to_domain(e: BaseException) -> MailQueueError:
    """NotFound for a missing object, BackendUnavailable for everything else."""
    if is_missing(e):
        return NotFound(f"blob not found ({getattr(e, 'code', '')})")
    return BackendUnavailable("s3", f"{type(e).__name__}: {e}")
