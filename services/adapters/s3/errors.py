"""What an S3 failure means to the mail queue, decided once for every S3 caller.

blob_svc's store (s3.py) and the retention sweep's tasks map obstore's errors here: a missing
object (or bucket) is NotFound, anything else (an error answer, a refused or reset connection, a
timeout) means S3 is unavailable.
"""

from __future__ import annotations

import obstore.exceptions

from services.domain.errors import BackendUnavailable, MailQueueError, NotFound

#: Exceptions raised by the S3 client, mapped by ``to_domain``. obstore raises a missing object
#: as the builtin FileNotFoundError (an OSError); its own errors derive from BaseError.
ERRORS: tuple[type[BaseException], ...] = (obstore.exceptions.BaseError, OSError, TimeoutError)


def is_missing(e: BaseException) -> bool:
    return isinstance(e, (FileNotFoundError, obstore.exceptions.NotFoundError))


def to_domain(e: BaseException) -> MailQueueError:
    """NotFound for a missing object, BackendUnavailable for everything else."""
    if is_missing(e):
        return NotFound("blob not found")
    return BackendUnavailable("s3", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
