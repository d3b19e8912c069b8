"""A 200 MiB blob round-trips through a real blob_svc process with bounded memory."""

import hashlib
import os
import subprocess
import sys

import grpc

from mailqueue.v1 import blob_pb2, blob_pb2_grpc
from stack.harness import ROOT, free_port, is_serving, service_env, wait_until

MiB = 1024 * 1024


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def test_200_mib_round_trip_keeps_peak_rss_growth_under_64_mib(keyspace, running_stack):
    port = free_port()
    env = service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_MAX_MAIL_BYTES=str(256 * MiB))  # over the 100 MiB default
    proc = subprocess.Popen([sys.executable, "-m", "blob_svc"], cwd=ROOT, stderr=subprocess.DEVNULL, env=env)
    target = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: is_serving(target), 60, what="blob_svc SERVING")
        stub = blob_pb2_grpc.BlobServiceStub(grpc.insecure_channel(target))
        stub.Put(iter([blob_pb2.PutRequest(chunk=b"warm-up")]))  # load every code path once
        baseline = _status_kib(proc.pid, "VmRSS")

        seed = os.urandom(MiB)
        digest = hashlib.sha256()

        def chunks():
            for i in range(200):
                chunk = seed[i:] + seed[:i]  # 200 distinct MiB, without holding 200 MiB here
                digest.update(chunk)
                yield blob_pb2.PutRequest(chunk=chunk)

        r = stub.Put(chunks(), timeout=300)
        assert r.size == 200 * MiB and r.blob_id == digest.hexdigest()
        back = hashlib.sha256()
        size = 0
        for part in stub.Get(blob_pb2.GetRequest(blob_id=r.blob_id), timeout=300):
            back.update(part.chunk)
            size += len(part.chunk)
        assert size == 200 * MiB and back.hexdigest() == r.blob_id
        peak = _status_kib(proc.pid, "VmHWM")
        growth_mib = (peak - baseline) / 1024
        print(f"\nblob_svc RSS: baseline {baseline / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, growth {growth_mib:.1f} MiB")
        assert growth_mib < 64
        stub.Delete(blob_pb2.DeleteRequest(blob_id=r.blob_id))
    finally:
        proc.kill()
        proc.wait()


def test_a_96_mib_mail_streams_through_enqueue_svc_to_s3_in_less_memory_than_itself(suite, keyspace):
    """enqueue_svc writes large content to S3 itself (the default): EnqueueStream hashes and spools
    it, then uploads it in parts; the process never holds the mail. Delivered by reference and
    read back whole through blob_svc's Get."""
    from mailqueue.v1 import enqueue_pb2, enqueue_pb2_grpc, mail_pb2
    from stack.harness import ServiceProcess
    from tests.integration.helpers import StreamConsumer

    queue = suite.new_queue()
    enqueue_proc = ServiceProcess("enqueue", service_env(keyspace))
    try:
        stub = enqueue_pb2_grpc.EnqueueServiceStub(enqueue_proc.channel())
        warm = enqueue_pb2.EnqueueRequest(queue=queue, mail=mail_pb2.Mail(name="warm-up", recipients=["b@example.org"]),
                                          inline_content=os.urandom(100_000))  # an S3 put once: every code path loaded
        stub.Enqueue(warm)
        baseline = _status_kib(enqueue_proc.proc.pid, "VmRSS")
        seed, digest = os.urandom(MiB), hashlib.sha256()

        def requests():
            yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(
                queue=queue, mail=mail_pb2.Mail(name="large", recipients=["b@example.org"])))
            for i in range(96):
                chunk = seed[i:] + seed[:i]
                digest.update(chunk)
                yield enqueue_pb2.EnqueueStreamRequest(chunk=chunk)

        receipt = stub.EnqueueStream(requests(), timeout=300).receipt
        peak = _status_kib(enqueue_proc.proc.pid, "VmHWM")
    finally:
        enqueue_proc.stop()
    growth_mib = (peak - baseline) / 1024
    print(f"\nenqueue_svc RSS: baseline {baseline / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, growth {growth_mib:.1f} MiB")
    assert growth_mib < 96
    assert receipt.size == 96 * MiB and list(receipt.blob_ids) == [digest.hexdigest()]
    c = StreamConsumer(suite.dequeue_stub, queue)
    names = {}
    for d in c.take(2):
        names[d.mail.mail.name] = d
        c.answer(d)
    c.close()
    d = names["large"]
    assert not d.content_inline and d.content == b""
    back, size = hashlib.sha256(), 0
    for part in suite.blob_stub.Get(blob_pb2.GetRequest(blob_id=d.mail.blob_ids[0]), timeout=300):
        back.update(part.chunk)
        size += len(part.chunk)
    assert (size, back.hexdigest()) == (96 * MiB, digest.hexdigest())
