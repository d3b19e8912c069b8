"""What TLS costs the batched enqueue path: every hop in the clear against every hop over TLS, in
one run, at 10 KiB and 100 KB.

    stack/stack.sh down && stack/stack.sh up --plaintext-loopback   # once: the clear baseline
    .venv/bin/python -m bench.tls_bench [--seconds 20] [--warmup 5] [--batch 32] [--concurrency 128] [--rounds 2]

Three phases per size, each on a fresh queue, with each service's own backend credential:

- ``clear``: gRPC in the clear on loopback (MAILQUEUE_PLAINTEXT), and the backends reached in the
  clear too: the stack's loopback-only plaintext listeners (RabbitMQ's 5672, Cassandra's optional
  client encryption, a second MinIO on 9002), which only ``up --plaintext-loopback`` opens;
- ``grpc-clear``: gRPC in the clear, the backends over TLS (what the gRPC hop's TLS costs alone);
- ``tls``: every hop over TLS, the default.

Rounds alternate the order (clear first, then tls first) so that neither side always meets a
colder or a fuller Cassandra; each round prints its own ratio and the summary their mean. The
ratio tls/clear is the price of secure by default. CPU per mail of every process shows where
it goes. Needs the stack up with the plaintext listeners: without them the run stops and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

import grpc

from bench.common import PORTS, bench_queue, new_keyspace, report, run, settle, start_services, stop
from bench.enqueue_bench import via_grpc_many
from mailqueue.v1 import admin_pb2, admin_pb2_grpc
from stack.harness import ROOT, stack

PKI = os.path.join(ROOT, ".stack", "pki")
MODES = ("clear", "grpc-clear", "tls")
SIZES = (10 * 1024, 100_000)


def plaintext_backends() -> dict[str, str]:
    """The operator's variables for the plaintext listeners, with every CA unset; refuses when the
    stack was started without them."""
    env = {}
    for line in stack("env", "--plaintext-loopback", "operator").stdout.splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    for key in ("MAILQUEUE_RABBITMQ_URL", "MAILQUEUE_S3_ENDPOINT"):
        host, port = env[key].split("//")[-1].split("/")[0].split(":")
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError:
            raise SystemExit(f"{key} {host}:{port} does not answer: the clear baseline needs the stack's plaintext "
                             "listeners (stack/stack.sh down && stack/stack.sh up --plaintext-loopback)") from None
    return {**env, "MAILQUEUE_CASSANDRA_CA_FILE": "", "MAILQUEUE_RABBITMQ_CA_FILE": "", "MAILQUEUE_S3_CA_FILE": ""}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    clear = plaintext_backends()
    keyspace = new_keyspace()
    with open(os.path.join(PKI, "ca.crt"), "rb") as f:
        trust = grpc.ssl_channel_credentials(f.read())
    tls = {"MAILQUEUE_TLS_CERT_FILE": os.path.join(PKI, "services.crt"), "MAILQUEUE_TLS_KEY_FILE": os.path.join(PKI, "services.key")}
    phases = {"clear": (clear, None), "grpc-clear": ({}, None), "tls": (tls, trust)}
    results: dict[tuple[int, str, int], dict] = {}
    for rnd, mode in ((r, m) for r in range(a.rounds) for m in (MODES if r % 2 == 0 else MODES[::-1])):
        extra, credentials = phases[mode]
        procs = start_services(keyspace, ["blob", "enqueue", "browse"], extra=extra, credentials=credentials)
        try:
            target = f"127.0.0.1:{PORTS['browse']}"
            admin = admin_pb2_grpc.AdminServiceStub(grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target))
            services = {"blob_svc": procs[0].pid, "enqueue_svc": procs[1].pid}
            for size in SIZES:
                queue = bench_queue(f"bench-{mode}-{size}-{rnd}")
                admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
                settle(f"round {rnd + 1}: {mode} {size} B")
                results[(size, mode, rnd)] = asyncio.run(via_grpc_many(queue, a.seconds, a.concurrency, size, a.warmup, services,
                                                                  a.batch, credentials))
        finally:
            stop(procs)
    print(f"\nEnqueueBatches of {a.batch}, {a.concurrency} mails in flight, {a.seconds:.0f} s each after {a.warmup:.0f} s; "
          f"clear: no TLS on any hop; grpc-clear: backends over TLS; tls: every hop; keyspace {keyspace}")
    for size in SIZES:
        for rnd in range(a.rounds):
            for mode in MODES:
                r = results[(size, mode, rnd)]
                print(report(f"{mode}-{size}-r{rnd + 1}", r) + f"  ({r['errors']} refused)")
                print(f"           {r['cpu']}")
            base = results[(size, "clear", rnd)]["per_s"]
            print(f"round {rnd + 1} ratio at {size} B: tls/clear {results[(size, 'tls', rnd)]['per_s'] / base:.2f}, "
                  f"grpc-clear/clear {results[(size, 'grpc-clear', rnd)]['per_s'] / base:.2f}")
        mean = {m: sum(results[(size, m, rnd)]["per_s"] for rnd in range(a.rounds)) / a.rounds for m in MODES}
        print(f"MEAN at {size} B: " + ", ".join(f"{m} {v:.0f}/s" for m, v in mean.items())
              + f"; tls/clear {mean['tls'] / mean['clear']:.2f}, grpc-clear/clear {mean['grpc-clear'] / mean['clear']:.2f}")


if __name__ == "__main__":
    run(main)
