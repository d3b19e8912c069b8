"""The HTTP response parsing of the event-loop S3 client (services/blobstores/s3async.py)."""

import asyncio

import pytest

from services.blobstores.s3async import S3ResponseError, _parse_head, _raise_for, _read_chunked


def test_a_response_with_a_length_keeps_the_connection():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nETag: \"x\"\r\n\r\n"
    assert _parse_head(head) == (200, 12, False, True)


def test_connection_close_or_no_framing_drops_the_connection():
    assert _parse_head(b"HTTP/1.1 503 Slow Down\r\nConnection: close\r\nContent-Length: 3\r\n\r\n")[3] is False
    assert _parse_head(b"HTTP/1.1 200 OK\r\n\r\n")[3] is False  # body runs to EOF: not reusable


def test_a_chunked_response_is_reassembled():
    reader = asyncio.StreamReader()
    reader.feed_data(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n")
    assert asyncio.run(_read_chunked(reader)) == b"hello world"
    assert _parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") == (200, 0, True, True)


def test_something_that_is_not_http_is_a_broken_connection():
    with pytest.raises(ConnectionResetError):
        _parse_head(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_an_error_answer_carries_the_s3_code():
    body = b"<?xml version='1.0'?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"
    with pytest.raises(S3ResponseError) as e:
        _raise_for(404, body)
    assert e.value.code == "NoSuchKey" and e.value.status == 404 and "does not exist" in str(e.value)
    _raise_for(204, b"")  # a success raises nothing


def test_s3_errors_map_to_not_found_only_for_a_missing_object():
    from minio.error import S3Error

    from services.blobstores import s3errors
    from services.errors import BackendUnavailable, NotFound

    def minio_error(code: str) -> S3Error:
        return S3Error(None, code, "message", "resource", "request-id", "host-id")

    assert isinstance(s3errors.to_domain(minio_error("NoSuchKey")), NotFound)
    assert isinstance(s3errors.to_domain(S3ResponseError(404, "NoSuchKey", "gone")), NotFound)
    assert isinstance(s3errors.to_domain(minio_error("AccessDenied")), BackendUnavailable)
    assert isinstance(s3errors.to_domain(S3ResponseError(503, "SlowDown", "busy")), BackendUnavailable)
    assert isinstance(s3errors.to_domain(ConnectionRefusedError()), BackendUnavailable)
    assert not s3errors.is_missing(ConnectionRefusedError())
