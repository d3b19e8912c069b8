"""BlobService through gRPC, served in-process with pytest-grpc's fixtures, on real MinIO."""

import hashlib
import os

import grpc
import pytest

from blob_svc.app import BlobApp
from blob_svc.servicer import BlobServicer
from mailqueue.v1 import blob_pb2, blob_pb2_grpc
from services.config import Settings
from tests.harness import service_env

CHUNK = 256 * 1024


@pytest.fixture(scope="module")
def blob_app(aio_loop, keyspace):
    app = BlobApp(Settings.from_env("blob", service_env(keyspace)))
    aio_loop.run(app.connect())
    app.connected = True
    return app


@pytest.fixture(scope="module")
def grpc_add_to_server():
    return blob_pb2_grpc.add_BlobServiceServicer_to_server


@pytest.fixture(scope="module")
def grpc_servicer(blob_app):
    return BlobServicer(blob_app)


@pytest.fixture(scope="module")
def grpc_stub_cls():
    return blob_pb2_grpc.BlobServiceStub


def put(stub, data: bytes, expected: str = "") -> blob_pb2.PutResponse:
    def requests():
        for i in range(0, max(len(data), 1), CHUNK):
            yield blob_pb2.PutRequest(chunk=data[i:i + CHUNK], expected_blob_id=expected if i == 0 else "")

    return stub.Put(requests())


def get(stub, blob_id: str) -> bytes:
    return b"".join(r.chunk for r in stub.Get(blob_pb2.GetRequest(blob_id=blob_id)))


def test_put_returns_the_sha256_and_get_streams_it_back(grpc_stub):
    data = os.urandom(3 * 1024 * 1024 + 17)  # above the in-memory threshold: spooled, multipart-sized
    r = put(grpc_stub, data)
    assert r.blob_id == hashlib.sha256(data).hexdigest() and r.size == len(data)
    assert get(grpc_stub, r.blob_id) == data
    assert grpc_stub.Stat(blob_pb2.StatRequest(blob_id=r.blob_id)).size == len(data)


def test_equal_content_is_stored_once(grpc_stub):
    data = os.urandom(1000)
    first, second = put(grpc_stub, data), put(grpc_stub, data)
    assert first.blob_id == second.blob_id
    assert (first.deduplicated, second.deduplicated) == (False, True)


def test_a_stated_id_that_does_not_match_is_refused_and_nothing_is_stored(grpc_stub):
    data = os.urandom(1000)
    with pytest.raises(grpc.RpcError) as e:
        put(grpc_stub, data, expected="0" * 64)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(data).hexdigest()))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_matching_stated_id_is_accepted(grpc_stub):
    data = os.urandom(500)
    assert put(grpc_stub, data, expected=hashlib.sha256(data).hexdigest()).size == 500


def test_empty_blob(grpc_stub):
    r = put(grpc_stub, b"")
    assert r.blob_id == hashlib.sha256(b"").hexdigest() and r.size == 0
    assert get(grpc_stub, r.blob_id) == b""


def test_put_bytes_stores_whole_content_and_get_bytes_returns_it(grpc_stub):
    data = os.urandom(10 * 1024)
    first = grpc_stub.PutBytes(blob_pb2.PutBytesRequest(content=data))
    assert first.blob_id == hashlib.sha256(data).hexdigest() and first.size == len(data) and not first.deduplicated
    again = grpc_stub.PutBytes(blob_pb2.PutBytesRequest(content=data, expected_blob_id=first.blob_id))
    assert again.blob_id == first.blob_id and again.deduplicated
    assert put(grpc_stub, data).deduplicated  # one store: the streamed Put finds the same blob
    assert grpc_stub.GetBytes(blob_pb2.GetBytesRequest(blob_id=first.blob_id)).content == data
    assert get(grpc_stub, first.blob_id) == data


def test_put_bytes_with_a_stated_id_that_does_not_match_stores_nothing(grpc_stub):
    data = os.urandom(1000)
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.PutBytes(blob_pb2.PutBytesRequest(content=data, expected_blob_id="0" * 64))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(data).hexdigest()))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_get_bytes_of_a_blob_over_the_message_limit_says_to_stream_it(grpc_stub):
    data = os.urandom(16 * 1024 * 1024 + 1)
    r = put(grpc_stub, data)
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.GetBytes(blob_pb2.GetBytesRequest(blob_id=r.blob_id))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "Get" in e.value.details()
    assert get(grpc_stub, r.blob_id) == data


@pytest.mark.parametrize("rpc", ["Get", "GetBytes", "Stat"])
def test_unknown_blob_is_not_found(grpc_stub, rpc):
    request = {"Get": blob_pb2.GetRequest, "GetBytes": blob_pb2.GetBytesRequest, "Stat": blob_pb2.StatRequest}[rpc](
        blob_id="f" * 64)
    with pytest.raises(grpc.RpcError) as e:
        result = getattr(grpc_stub, rpc)(request)
        list(result) if rpc == "Get" else result
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_malformed_blob_id_is_invalid(grpc_stub):
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.Stat(blob_pb2.StatRequest(blob_id="../etc/passwd"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_delete_is_idempotent(grpc_stub):
    r = put(grpc_stub, os.urandom(100))
    assert grpc_stub.Delete(blob_pb2.DeleteRequest(blob_id=r.blob_id)).existed is True
    assert grpc_stub.Delete(blob_pb2.DeleteRequest(blob_id=r.blob_id)).existed is False
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.Stat(blob_pb2.StatRequest(blob_id=r.blob_id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
