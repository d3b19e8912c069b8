"""What an S3 client error means to the mail queue (services/adapters/s3/errors.py)."""

import urllib3.exceptions
from minio.error import InvalidResponseError, S3Error, ServerError

from services.adapters.s3 import errors as s3errors
from services.domain.errors import BackendUnavailable, NotFound


def _s3_error(code: str) -> S3Error:
    return S3Error(None, code, "message", "/b/k", "req", "host")


def test_a_missing_object_is_not_found():
    assert s3errors.is_missing(_s3_error("NoSuchKey"))
    assert isinstance(s3errors.to_domain(_s3_error("NoSuchKey")), NotFound)


def test_a_missing_bucket_is_unavailable_and_says_to_create_it():
    # NotFound would dead-letter every mail read from S3 as "content missing", for good.
    e = _s3_error("NoSuchBucket")
    assert not s3errors.is_missing(e)
    mapped = s3errors.to_domain(e)
    assert isinstance(mapped, BackendUnavailable) and "create it" in str(mapped)


def test_every_other_failure_means_s3_is_unavailable():
    for e in (
        _s3_error("AccessDenied"),
        _s3_error("SlowDown"),
        ServerError("server failed with HTTP status code 503\nmore", 503),
        InvalidResponseError(502, "text/html", "<html>bad gateway</html>"),
        urllib3.exceptions.MaxRetryError(None, "/b/k", "connection refused"),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        ConnectionRefusedError(),
        TimeoutError(),
    ):
        assert not s3errors.is_missing(e)
        mapped = s3errors.to_domain(e)
        assert isinstance(mapped, BackendUnavailable), e
        assert "\n" not in str(mapped)  # one line in the status message


def test_the_errors_the_callers_catch_include_the_clients_own():
    for cls in (S3Error, ServerError, InvalidResponseError, urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.MaxRetryError):
        assert issubclass(cls, s3errors.ERRORS)
