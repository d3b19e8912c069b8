"""How the S3 client is configured from the settings (services/adapters/s3/client.py; no network)."""

import dataclasses

from services.adapters.s3 import client as s3client
from services.domain.config import S3Settings


def test_plain_http_signs_the_payload_and_tls_leaves_it_to_the_transport():
    plain = s3client.store(S3Settings(endpoint="127.0.0.1:9000", bucket="b"))
    assert plain.config["endpoint"] == "http://127.0.0.1:9000" and plain.config["bucket"] == "b"
    assert plain.config["unsigned_payload"] == "false"
    assert plain.client_options["allow_http"] == "true"
    tls = s3client.store(dataclasses.replace(S3Settings(), endpoint="s3.example.org", secure=True))
    assert tls.config["endpoint"] == "https://s3.example.org" and tls.config["unsigned_payload"] == "true"
    assert tls.client_options["allow_http"] == "false"


def test_requests_are_path_style_with_a_default_region_and_bounded_retries():
    c = s3client.store(S3Settings())
    assert c.config["virtual_hosted_style_request"] == "false"  # MinIO serves /bucket/key
    assert c.config["region"] == "us-east-1"
    assert c.retry_config["max_retries"] == s3client.RETRIES and c.retry_config["retry_timeout"] == s3client.RETRY_WITHIN
