"""How the S3 client is configured from the settings (services/adapters/s3/client.py; no network)."""

import dataclasses
import inspect

from minio import Minio

from services.adapters.s3 import client as s3client
from services.adapters.s3.settings import S3Settings


def test_plain_http_signs_the_payload_and_tls_leaves_it_to_the_transport():
    plain = s3client.Bucket(S3Settings(endpoint="127.0.0.1:9000", bucket="b"))
    assert plain.name == "b" and not plain.client._base_url.is_https  # noqa: SLF001
    headers, _ = plain.client._build_headers("127.0.0.1:9000", {}, b"x", plain.client._provider.retrieve())  # noqa: SLF001
    assert headers["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"  # the SHA-256 of the body
    tls = s3client.Bucket(dataclasses.replace(S3Settings(), endpoint="s3.example.org", secure=True))
    headers, _ = tls.client._build_headers("s3.example.org", {}, b"x", tls.client._provider.retrieve())  # noqa: SLF001
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"


def test_a_default_region_pooled_connections_and_bounded_retries():
    settings = dataclasses.replace(S3Settings(), pool_size=48)
    b = s3client.Bucket(settings)
    assert b.region == "us-east-1"  # given: no GetBucketLocation before the first request
    http = b.client._http  # noqa: SLF001
    assert http.connection_pool_kw["maxsize"] == 48
    retries = http.connection_pool_kw["retries"]
    assert retries.total == s3client.RETRIES and 503 in retries.status_forcelist
    assert "POST" not in retries.allowed_methods  # a CompleteMultipartUpload is never sent twice
    timeout = http.connection_pool_kw["timeout"]
    assert (timeout.connect_timeout, timeout.read_timeout) == (s3client.CONNECT_TIMEOUT_S, s3client.READ_TIMEOUT_S)


def test_the_conditional_put_uses_the_sdks_putobject_call():
    """put_if_absent sends If-None-Match through the SDK's own PutObject call (its public
    put_object would turn the header into metadata): the call must keep its shape."""
    params = list(inspect.signature(Minio._put_object).parameters)  # noqa: SLF001
    assert params[:5] == ["self", "bucket_name", "object_name", "data", "headers"]
