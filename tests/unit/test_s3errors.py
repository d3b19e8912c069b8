"""What an S3 client error means to the mail queue (services/adapters/s3/errors.py)."""

import obstore.exceptions

from services.adapters.s3 import errors as s3errors
from services.domain.errors import BackendUnavailable, NotFound


def test_a_missing_object_is_not_found():
    # obstore raises a missing object as the builtin FileNotFoundError; its own class exists too.
    assert isinstance(s3errors.to_domain(FileNotFoundError("Object at location blobs/ab not found")), NotFound)
    assert isinstance(s3errors.to_domain(obstore.exceptions.NotFoundError("gone")), NotFound)


def test_every_other_failure_means_s3_is_unavailable():
    for e in (
        obstore.exceptions.GenericError("Generic S3 error: 503 SlowDown\nDebug source: ..."),
        obstore.exceptions.PermissionDeniedError("AccessDenied"),
        ConnectionRefusedError(),
        TimeoutError(),
    ):
        assert not s3errors.is_missing(e)
        mapped = s3errors.to_domain(e)
        assert isinstance(mapped, BackendUnavailable), e
        assert "\n" not in str(mapped)  # one line: obstore's debug dump stays out of the status message


def test_the_errors_the_callers_catch_include_the_clients_own():
    assert issubclass(obstore.exceptions.GenericError, s3errors.ERRORS)
    assert issubclass(FileNotFoundError, s3errors.ERRORS)
