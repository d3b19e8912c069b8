"""BlobService through gRPC, served in-process with pytest-grpc's fixtures, on real Cassandra and MinIO.

One contract, run against both stores blob_svc can serve: the tiered one (content up to 64 KiB
in Cassandra, larger in S3; the default) and S3 alone (MAILQUEUE_SMALL_BLOB_BYTES=0). Contents of
both size classes go through each.
"""

import hashlib
import os

import grpc
import pytest

from blob_svc.app import BlobApp
from blob_svc.servicer import BlobServicer
from mailqueue.v1 import blob_pb2, blob_pb2_grpc
from services.runtime.settings import Settings
from stack.harness import service_env

CHUNK = 256 * 1024


#: Content sizes on either side of the 64 KiB small-blob limit.
SIZES = [1000, 100_000]


@pytest.fixture(scope="module", params=["tiered", "s3-only"])
def blob_app(request, aio_loop, keyspace):
    extra = {"MAILQUEUE_SMALL_BLOB_BYTES": "0"} if request.param == "s3-only" else {}
    app = BlobApp(Settings.from_env("blob", service_env(keyspace, **extra)))
    aio_loop.run(app.connect())
    app.connected = True
    yield app
    aio_loop.run(app.close())  # its Cassandra cluster shut down: no driver thread outlives the run


@pytest.fixture(scope="module")
def grpc_add_to_server():
    return blob_pb2_grpc.add_BlobServiceServicer_to_server


@pytest.fixture(scope="module")
def grpc_servicer(blob_app):
    return BlobServicer(blob_app.store)


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


@pytest.mark.parametrize("size", SIZES)
def test_equal_content_is_stored_once(grpc_stub, size):
    data = os.urandom(size)
    first, second = put(grpc_stub, data), put(grpc_stub, data)
    assert first.blob_id == second.blob_id
    assert (first.deduplicated, second.deduplicated) == (False, True)


@pytest.mark.parametrize("size", SIZES)
def test_a_stated_id_that_does_not_match_is_refused_and_nothing_is_stored(grpc_stub, size):
    data = os.urandom(size)
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
    assert grpc_stub.GetBytes(blob_pb2.GetBytesRequest(blob_id=r.blob_id)).content == b""


@pytest.mark.parametrize("size", SIZES)
def test_put_bytes_stores_whole_content_and_get_bytes_returns_it(grpc_stub, size):
    data = os.urandom(size)
    first = grpc_stub.PutBytes(blob_pb2.PutBytesRequest(content=data))
    assert first.blob_id == hashlib.sha256(data).hexdigest() and first.size == len(data) and not first.deduplicated
    again = grpc_stub.PutBytes(blob_pb2.PutBytesRequest(content=data, expected_blob_id=first.blob_id))
    assert again.blob_id == first.blob_id and again.deduplicated
    assert put(grpc_stub, data).deduplicated  # one store: the streamed Put finds the same blob
    assert grpc_stub.GetBytes(blob_pb2.GetBytesRequest(blob_id=first.blob_id)).content == data
    assert get(grpc_stub, first.blob_id) == data


@pytest.mark.parametrize("size", [1000, 100_000])  # the small-blob table, S3
def test_put_bytes_with_a_stated_id_that_does_not_match_stores_nothing(grpc_stub, size):
    data = os.urandom(size)
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


@pytest.mark.parametrize("size", SIZES)
def test_delete_is_idempotent(grpc_stub, size):
    r = put(grpc_stub, os.urandom(size))
    assert grpc_stub.Delete(blob_pb2.DeleteRequest(blob_id=r.blob_id)).existed is True
    assert grpc_stub.Delete(blob_pb2.DeleteRequest(blob_id=r.blob_id)).existed is False
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub.Stat(blob_pb2.StatRequest(blob_id=r.blob_id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("size", SIZES)
def test_content_lives_in_cassandra_up_to_the_small_limit_and_in_s3_above(grpc_stub, blob_app, aio_loop, keyspace, size):
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import execute
    from services.adapters.s3 import client as s3client

    r = put(grpc_stub, os.urandom(size))
    tiered = blob_app.settings.limits.small_blob_bytes > 0
    rows = aio_loop.run(execute(blob_app._backends.view.session, f"SELECT size FROM {keyspace}.{schema.BLOBS} WHERE blob_id = %s", (r.blob_id,)))
    objects = [o.key for o in s3client.Bucket(blob_app.settings.s3).objects(f"blobs/{r.blob_id[:8]}")]
    in_cassandra = tiered and size <= blob_app.settings.limits.small_blob_bytes
    assert ([row.size for row in rows], len(objects)) == (([size], 0) if in_cassandra else ([], 1))


def test_a_put_that_deduplicates_refreshes_the_objects_age_once_per_interval(grpc_stub, blob_app):
    """The sweep collects unreferenced S3 blobs older than its grace: a new mail that reuses an old
    blob must make it young again (rewritten once per ``touch_interval_s`` per key)."""
    import datetime as dt

    from services.adapters.s3 import client as s3client
    from stack.harness import wait_until

    data = os.urandom(100_000)  # over the small-blob limit: an S3 object in both stores
    first = put(grpc_stub, data)
    s3 = s3client.Bucket(blob_app.settings.s3)
    key = f"blobs/{first.blob_id}"
    written = s3.head(key).last_modified
    # S3 keeps modification times to the second: wait for the clock to pass the next one.
    wait_until(lambda: dt.datetime.now(dt.timezone.utc) >= written + dt.timedelta(seconds=1.2), what="next second")
    assert put(grpc_stub, data).deduplicated
    touched = s3.head(key).last_modified
    assert touched > written
    assert put(grpc_stub, data).deduplicated
    assert s3.head(key).last_modified == touched  # within the interval: not touched again


def test_deleting_a_small_blob_while_s3_is_down_says_it_existed(aio_loop, keyspace):
    """A small blob lives in Cassandra: with S3 unreachable, Delete removed its row, then failed
    on S3's step with UNAVAILABLE ("not applied, retry it"), and the retry answered existed=false.
    Now its row gone is the answer: existed=true."""
    from stack.harness import free_port
    from tests.inprocess import RunningApp

    app = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_S3_ENDPOINT=f"127.0.0.1:{free_port()}"))
    try:
        stub = blob_pb2_grpc.BlobServiceStub(app.channel())
        blob_id = put(stub, os.urandom(1000)).blob_id  # small: Cassandra's tier, S3 not asked
        assert stub.Delete(blob_pb2.DeleteRequest(blob_id=blob_id), timeout=60).existed
        with pytest.raises(grpc.RpcError) as e:
            stub.Stat(blob_pb2.StatRequest(blob_id=blob_id), timeout=60)
        assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
    finally:
        app.stop()


def test_a_put_killed_mid_way_leaves_no_spool_file_past_the_next_start(aio_loop, keyspace, tmp_path):
    """A large Put spools to a file kept until its upload (``delete=False``): a process killed
    mid-Put left it (up to the blob limit) in the spool folder, a 2 GiB emptyDir on Kubernetes,
    for good. A blob_svc that starts removes those an hour old; a fresh one (another worker's Put
    under way) stays."""
    import time

    from tests.inprocess import RunningApp

    old, fresh = tmp_path / "mailqueue-blob-killedmidput", tmp_path / "mailqueue-blob-underway"
    old.write_bytes(os.urandom(1000))
    fresh.write_bytes(os.urandom(1000))
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    app = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_SPOOL_DIR=str(tmp_path)))
    try:
        assert not old.exists() and fresh.exists()
        stub = blob_pb2_grpc.BlobServiceStub(app.channel())
        content = os.urandom(5 * 1024 * 1024)  # over the in-memory part: spooled, then uploaded
        assert put(stub, content).blob_id == hashlib.sha256(content).hexdigest()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["mailqueue-blob-underway"]  # its own spool file gone
    finally:
        app.stop()


def test_a_spool_folder_that_cannot_take_a_file_is_unavailable_not_internal(aio_loop, keyspace, tmp_path):
    """A large Put opens its spool file outside the mapping of the spool's errors: a folder gone
    (an unmounted volume), read-only or full answered INTERNAL, which clients do not retry."""
    from tests.inprocess import RunningApp

    folder = tmp_path / "spool"
    folder.mkdir()
    app = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_SPOOL_DIR=str(folder)))
    try:
        stub = blob_pb2_grpc.BlobServiceStub(app.channel())
        folder.rmdir()
        content = os.urandom(5 * 1024 * 1024)  # over the in-memory part: spooled
        with pytest.raises(grpc.RpcError) as e:
            put(stub, content)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "MAILQUEUE_SPOOL_DIR" in e.value.details(), e.value
        folder.mkdir()
        assert put(stub, content).blob_id == hashlib.sha256(content).hexdigest()  # back once it can
    finally:
        app.stop()


def test_a_small_blob_over_a_blob_limit_below_the_small_blob_size_is_refused_and_not_stored(aio_loop, keyspace):
    """Blobs up to MAILQUEUE_SMALL_BLOB_BYTES (64 KiB) go to Cassandra's table, which checked no
    limit: with MAILQUEUE_MAX_BLOB_BYTES=1000, a 2,000-byte blob was stored. Refused now, both
    ways of putting it, and nothing stored; one within the limit is."""
    from tests.inprocess import RunningApp

    app = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_MAX_BLOB_BYTES="1000"))
    try:
        stub = blob_pb2_grpc.BlobServiceStub(app.channel())
        data = os.urandom(2000)
        with pytest.raises(grpc.RpcError) as e:
            stub.PutBytes(blob_pb2.PutBytesRequest(content=data))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "1000" in e.value.details(), e.value
        with pytest.raises(grpc.RpcError) as e:
            put(stub, data)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
        with pytest.raises(grpc.RpcError) as e:
            stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(data).hexdigest()))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        small = os.urandom(1000)
        assert put(stub, small).blob_id == hashlib.sha256(small).hexdigest()
    finally:
        app.stop()


def test_a_put_through_blob_svc_that_blob_svc_ends_mid_way_says_why(aio_loop, keyspace):
    """enqueue_svc forwards a stream's chunks to blob_svc as they come. When blob_svc ended the
    Put first (here its blob limit, below enqueue_svc's mail limit; or a restart, a full spool),
    the next chunk's write raised asyncio's InvalidStateError, which reached the producer as
    INTERNAL; it is blob_svc's own status now."""
    import asyncio

    from services.adapters.blob_service import RemoteBlobStore
    from services.domain.errors import ResourceExhausted
    from tests.inprocess import RunningApp

    app = RunningApp(aio_loop, BlobApp, "blob", service_env(keyspace, MAILQUEUE_MAX_BLOB_BYTES="150000"))

    async def paced():
        for _ in range(6):
            yield os.urandom(64 * 1024)  # past the small-blob part (Cassandra): the S3 part checks the limit as it comes
            await asyncio.sleep(0.3)  # the client's pace: blob_svc's answer arrives between two writes

    async def put():
        store = RemoteBlobStore(app.target, timeout_s=10)
        try:
            return await store.put(paced())
        finally:
            await store.close()

    try:
        with pytest.raises(ResourceExhausted, match="exceeds"):
            aio_loop.run(put())
    finally:
        app.stop()


def test_a_put_through_blob_svc_goes_at_its_clients_pace_past_the_call_timeout(grpc_addr, grpc_stub, aio_loop):
    """enqueue_svc puts a stream's content through blob_svc (MAILQUEUE_BLOB_TARGET) as its client
    sends it. The whole Put had a 60 s deadline: an upload longer than that (100 MiB at 1 MB/s)
    failed UNAVAILABLE every time. Each step is bounded now, not the whole (here 1 s, 4 chunks
    half a second apart)."""
    import asyncio

    from services.adapters.blob_service import RemoteBlobStore

    parts = [os.urandom(1000) for _ in range(4)]

    async def slow():
        for part in parts:
            await asyncio.sleep(0.5)  # the client's pace, not a wait for state
            yield part

    async def put():
        store = RemoteBlobStore(grpc_addr, timeout_s=1)
        try:
            return await store.put(slow())
        finally:
            await store.close()

    info = aio_loop.run(put())
    assert info.size == 4000 and get(grpc_stub, info.blob_id) == b"".join(parts)
