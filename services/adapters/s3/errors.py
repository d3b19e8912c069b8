"""What an S3 failure means to the mail queue, decided once for every S3 caller.

blob_svc's store (store.py) and the retention sweep's tasks map the minio SDK's errors here: a
missing object (or bucket) is NotFound, anything else (an error answer, a refused or reset
connection, a timeout, retries exhausted) means S3 is unavailable.
"""

from __future__ import annotations

import urllib3.exceptions
from minio.error import MinioException, S3Error

from services.domain.errors import BackendUnavailable, CredentialsRefused, MailQueueError, NotFound

#: Exceptions raised by the S3 client, mapped by ``to_domain``: the SDK's own (an S3 error
#: answer, a 5xx, an answer it cannot read) and urllib3's (connection, timeout, retries exhausted).
ERRORS: tuple[type[BaseException], ...] = (MinioException, urllib3.exceptions.HTTPError, OSError, TimeoutError)
MISSING = ("NoSuchKey", "NoSuchObject")
#: S3's answers to credentials it does not take, or a user a policy does not allow.
REFUSED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


def is_missing(e: BaseException) -> bool:
    return isinstance(e, S3Error) and e.code in MISSING


def to_domain(e: BaseException) -> MailQueueError:
    """NotFound for a missing object, BackendUnavailable for everything else."""
    if is_missing(e):
        return NotFound("blob not found")
    if isinstance(e, S3Error) and e.code == "NoSuchBucket":  # not a missing blob: every read would say so
        return BackendUnavailable("s3", f"the bucket {e.bucket_name or ''} does not exist: create it (MAILQUEUE_S3_BUCKET) "
                                        "with the S3 admin, or point MAILQUEUE_S3_BUCKET at it")
    text = str(e).splitlines()[0] if str(e) else ""
    if isinstance(e, S3Error) and e.code in REFUSED:  # this process's S3 user: a setting to fix, not an outage
        return CredentialsRefused("s3", f"{type(e).__name__}: {text}")
    return BackendUnavailable("s3", f"{type(e).__name__}: {text}")
