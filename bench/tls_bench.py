"""What TLS costs the batched enqueue path: the same phases with gRPC served in the clear and over
TLS, in one run, at 10 KiB and 100 KB.

    .venv/bin/python -m bench.tls_bench [--seconds 20] [--warmup 5] [--batch 32] [--concurrency 128]

Each size runs twice on fresh queues: enqueue_svc serving gRPC in the clear on loopback
(MAILQUEUE_PLAINTEXT) and serving TLS with the local CA's certificate (.stack/pki), the client
over TLS. The backends are reached over TLS with each service's own credential in both: the
local stack serves TLS only (README "Security"), so this run measures the gRPC hop's TLS, and the
CPU per mail of every process shows what the backends' TLS costs each of them. Needs the stack up.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import grpc

from bench.common import PORTS, bench_queue, new_keyspace, report, run, settle, start_services, stop
from bench.enqueue_bench import via_grpc_many
from mailqueue.v1 import admin_pb2, admin_pb2_grpc
from tests.harness import ROOT

PKI = os.path.join(ROOT, ".stack", "pki")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=128)
    a = p.parse_args()
    keyspace = new_keyspace()
    with open(os.path.join(PKI, "ca.crt"), "rb") as f:
        trust = grpc.ssl_channel_credentials(f.read())
    tls = {"MAILQUEUE_TLS_CERT_FILE": os.path.join(PKI, "services.crt"), "MAILQUEUE_TLS_KEY_FILE": os.path.join(PKI, "services.key")}
    results: dict[tuple[int, str], dict] = {}
    for mode, extra, credentials in (("plaintext", {}, None), ("tls", tls, trust)):
        procs = start_services(keyspace, ["blob", "enqueue", "browse"], extra=extra, credentials=credentials)
        try:
            target = f"127.0.0.1:{PORTS['browse']}"
            admin = admin_pb2_grpc.AdminServiceStub(grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target))
            services = {"blob_svc": procs[0].pid, "enqueue_svc": procs[1].pid}
            for size in (10 * 1024, 100_000):
                queue = bench_queue(f"bench-{mode}-{size}")
                admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
                settle(f"{mode} {size} B")
                results[(size, mode)] = asyncio.run(via_grpc_many(queue, a.seconds, a.concurrency, size, a.warmup, services,
                                                                  a.batch, credentials))
        finally:
            stop(procs)
    print(f"\nEnqueueBatches of {a.batch}, {a.concurrency} mails in flight, {a.seconds:.0f} s each after {a.warmup:.0f} s; "
          f"backends over TLS in every phase; keyspace {keyspace}")
    for size in (10 * 1024, 100_000):
        for mode in ("plaintext", "tls"):
            r = results[(size, mode)]
            print(report(f"{mode}-{size}", r) + f"  ({r['errors']} refused)")
            print(f"           {r['cpu']}")
        print(f"ratio tls/plaintext at {size} B: {results[(size, 'tls')]['per_s'] / results[(size, 'plaintext')]['per_s']:.2f}")


if __name__ == "__main__":
    run(main)
