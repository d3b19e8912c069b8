"""Large mails end to end: memory stays bounded however large the mail.

    .venv/bin/python -m bench.large_mail_bench [--sizes 10,50] [--mails 3]

Each mail (``--sizes`` in MiB) is streamed into enqueue_svc with EnqueueStream in 1 MiB chunks
(enqueue_svc hashes it, spools it and uploads it to S3 in 5 MiB parts), delivered by dequeue_svc
(by reference: over the inline limit), read back by the consumer through blob_svc's streaming Get
and checked against its SHA-256, then answered SUCCESS. The content is generated as it is sent:
the bench itself holds 1 MiB. Printed per size: seconds and MiB/s of each way, and the peak RSS
(VmHWM) of each service process against its RSS before the first mail. Needs the stack up.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import grpc

from bench.common import PORTS, bench_queue, new_keyspace, run, start_services, stop
from mailqueue.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    blob_pb2,
    blob_pb2_grpc,
    dequeue_pb2,
    dequeue_pb2_grpc,
    enqueue_pb2,
    enqueue_pb2_grpc,
    mail_pb2,
)

MiB = 1024 * 1024


def status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"{field} not in /proc/{pid}/status")


def chunks(size_mib: int, seed: bytes, digest: hashlib._Hash):  # noqa: SLF001 - hashlib's type
    for i in range(size_mib):
        chunk = seed[i:] + seed[:i]  # distinct MiBs without holding the mail
        digest.update(chunk)
        yield chunk


def enqueue(stub, queue: str, size_mib: int, seed: bytes) -> tuple[str, str]:
    digest = hashlib.sha256()
    header = enqueue_pb2.EnqueueHeader(queue=queue, mail=mail_pb2.Mail(name=f"large-{size_mib}", sender="a@example.com",
                                                                          recipients=["b@example.org"]))

    def requests():
        yield enqueue_pb2.EnqueueStreamRequest(header=header)
        for chunk in chunks(size_mib, seed, digest):
            yield enqueue_pb2.EnqueueStreamRequest(chunk=chunk)

    receipt = stub.EnqueueStream(requests(), timeout=600).receipt
    return receipt.enqueue_id, digest.hexdigest()


def dequeue(stub, blobs, queue: str) -> tuple[str, str, int]:
    """One delivery, its content read through blob_svc, answered SUCCESS: (enqueue id, sha-256, bytes)."""
    requests: list = [dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=1))]
    import queue as q

    outbox: q.Queue = q.Queue()
    outbox.put(requests[0])
    call = stub.Dequeue(iter(outbox.get, None), timeout=600)
    for response in call:
        if response.WhichOneof("kind") != "delivery":
            continue
        d = response.delivery
        digest, size = hashlib.sha256(), 0
        for blob_id in d.mail.blob_ids:
            for part in blobs.Get(blob_pb2.GetRequest(blob_id=blob_id), timeout=600):
                digest.update(part.chunk)
                size += len(part.chunk)
        outbox.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
            delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
        outbox.put(None)
        for _ in call:
            pass
        return d.mail.enqueue_id, digest.hexdigest(), size
    raise SystemExit("the stream ended without a delivery")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,50", help="mail sizes in MiB, comma-separated")
    p.add_argument("--mails", type=int, default=3, help="mails of each size")
    a = p.parse_args()
    keyspace = new_keyspace()
    queue = bench_queue("bench-large")
    names = ["blob", "enqueue", "dequeue", "browse"]
    procs = start_services(keyspace, names)
    pids = {f"{n}_svc": proc.pid for n, proc in zip(names, procs)}
    try:
        admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}")).CreateQueue(
            admin_pb2.CreateQueueRequest(queue=queue))
        limit = [("grpc.max_receive_message_length", 64 * MiB)]
        enq = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}", limit))
        deq = dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['dequeue']}", limit))
        blobs = blob_pb2_grpc.BlobServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['blob']}", limit))
        before = {n: status_mib(pid, "VmRSS") for n, pid in pids.items()}
        seed = os.urandom(MiB)
        print(f"\nlarge mails, {a.mails} of each size, keyspace {keyspace}; RSS before: "
              + ", ".join(f"{n} {v:.0f} MiB" for n, v in before.items()))
        for size in (int(s) for s in a.sizes.split(",")):
            ins, outs = [], []
            for i in range(a.mails):
                seed = seed[1:] + seed[:1]  # each mail distinct
                began = time.monotonic()
                enqueue_id, sent = enqueue(enq, queue, size, seed)
                ins.append(time.monotonic() - began)
                began = time.monotonic()
                got_id, received, n = dequeue(deq, blobs, queue)
                outs.append(time.monotonic() - began)
                if (got_id, received, n) != (enqueue_id, sent, size * MiB):
                    raise SystemExit(f"mail {i} of {size} MiB came back different: {got_id} {n} bytes")
            peaks = {n: status_mib(pid, "VmHWM") for n, pid in pids.items()}
            print(f"{size:>3} MiB: enqueue {min(ins):.2f}-{max(ins):.2f} s ({size / min(ins):.0f} MiB/s at best), "
                  f"dequeue + Get {min(outs):.2f}-{max(outs):.2f} s ({size / min(outs):.0f} MiB/s at best); content checked")
            print("         peak RSS so far: " + ", ".join(f"{n} {peaks[n]:.0f} MiB (+{peaks[n] - before[n]:.0f})" for n in pids))
    finally:
        stop(procs)


if __name__ == "__main__":
    run(main)
