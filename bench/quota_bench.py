"""Enqueue quotas: the CPU one quota check costs enqueue_svc per mail (the check runs in the
process, no backend call), against what a mail costs enqueue_svc on the benchmarks page.

    .venv/bin/python -m bench.quota_bench [--mails 200000]
    .venv/bin/python -m bench.quota_bench --end-to-end [--seconds 10] [--warmup 3] [--concurrency 64] [--batch 32]

A QuotaKeeper is given a snapshot by hand (no store: the refresh runs once a second, not per
mail) and checks ``--mails`` mails in three cases: no quota at all; quotas that do not apply to the
mails (other tenants and senders, 1,000 of them); and four quotas that apply to every mail (its
tenant, sender, sender domain and queue, each with a mail and a byte rate, never binding).

``--end-to-end``: through gRPC on the real stack (enqueue_svc, blob_svc, browse_svc on the bench
ports, bench/enqueue_bench.py's phases): unary Enqueue (``--concurrency`` callers) and
EnqueueBatches (``--batch`` mails per message), each once with no quota and once with three quotas
applying to every mail (its queue, with both depth limits too; its sender; its sender domain;
each with a mail and a byte rate, never binding), each phase on a new queue after the stack
settles (at most ``SETTLE_S``). No access control: no tenant quota.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from services.app.quota_keeper import QuotaKeeper
from services.domain import quotas
from services.ports.quotas import QuotaSnapshot

#: CPU per mail in enqueue_svc, ms (docs/pages/benchmarks.md, "One Enqueue at a time", 10 KiB).
UNARY_MS, BATCHED_MS = 1.13, 0.58


def keeper(found: list[quotas.Quota]) -> QuotaKeeper:
    async def depth(_queue: str) -> quotas.Depth:
        return quotas.Depth()

    k = QuotaKeeper(store=None, depth=depth, member="bench")  # type: ignore[arg-type]
    k.apply(QuotaSnapshot(tuple(found), ("bench",)), {})
    k._seen_since = time.monotonic() - 10  # joined long ago
    return k


def per_mail_us(k: QuotaKeeper, mails: int) -> float:
    facts = quotas.Facts("acme", "Bob@Example.com", "outbound", 10_240)
    began = time.process_time()
    for _ in range(mails):
        k.check(facts)
    return (time.process_time() - began) / mails * 1e6


#: The longest wait for an idle stack before a phase (a shared machine may never be idle).
SETTLE_S = 30.0
HUGE = dict(mails_per_s=1e9, burst_mails=10**9, bytes_per_s=1e12, burst_bytes=10**12)


def end_to_end(a: argparse.Namespace) -> None:
    import grpc

    from bench import enqueue_bench as eb
    from bench.common import PORTS, bench_queue, metric, new_keyspace, settle, start_services, stop
    from mailqueue.v1 import admin_pb2, admin_pb2_grpc, quotas_pb2

    procs = start_services(new_keyspace(), ["blob", "enqueue", "browse"], metrics={"enqueue": eb.ENQUEUE_METRICS})
    services = {"blob_svc": procs[0].pid, "enqueue_svc": procs[1].pid}
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
    sender = "a@example.com"  # enqueue_bench's mails' sender
    subjects = [(quotas_pb2.QUOTA_KIND_SENDER, sender), (quotas_pb2.QUOTA_KIND_SENDER_DOMAIN, "example.com")]

    def quotas_on(queue: str) -> None:
        for kind, subject in [*subjects, (quotas_pb2.QUOTA_KIND_QUEUE, queue)]:
            q = quotas_pb2.Quota(kind=kind, subject=subject, **HUGE)
            if kind == quotas_pb2.QUOTA_KIND_QUEUE:
                q.max_queued_mails, q.max_queued_bytes = 10**12, 10**15
            admin.SetQuota(admin_pb2.SetQuotaRequest(quota=q))
        wait_metric(lambda: metric(eb.ENQUEUE_METRICS, "mailqueue_quota_limit", kind="queue", subject=queue) > 0)

    def quotas_off(queue: str) -> None:
        for kind, subject in [*subjects, (quotas_pb2.QUOTA_KIND_QUEUE, queue)]:
            admin.ClearQuota(admin_pb2.ClearQuotaRequest(kind=kind, subject=subject))
        wait_metric(lambda: metric(eb.ENQUEUE_METRICS, "mailqueue_quota_limit", kind="sender", subject=sender) == 0)

    def phase(name: str, quota: bool) -> dict[str, Any]:
        queue = bench_queue(f"bench-q{len(results)}")
        admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
        if quota:
            quotas_on(queue)
        settle(name, SETTLE_S)
        if name == "unary":
            r = asyncio.run(eb.via_grpc(queue, a.seconds, a.concurrency, 10_240, a.warmup, services))
        else:
            r = asyncio.run(eb.via_grpc_many(queue, a.seconds, a.concurrency, 10_240, a.warmup, services, a.batch))
        if quota:
            quotas_off(queue)
        return r

    results: dict[tuple[str, bool], dict[str, Any]] = {}
    try:
        for name in ("unary", "batched"):
            for quota in (False, True):
                results[(name, quota)] = phase(name, quota)
    finally:
        stop(procs)
    print(f"\n10 KiB mails, concurrency {a.concurrency}, batches of {a.batch}, {a.seconds:.0f} s per phase after "
          f"{a.warmup:.0f} s of warm-up, one run")
    print("| path | quotas | mails/s | p50 ms | p99 ms | refused | rate with quotas / without |")
    print("|---|---|---|---|---|---|---|")
    for (name, quota), r in results.items():
        ratio = f"{r['per_s'] / results[(name, False)]['per_s']:.3f}" if quota else "-"
        print(f"| {name} | {'3 applying' if quota else 'none'} | {r['per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r.get('errors', 0)} | {ratio} |")
        print(f"|   | CPU per mail: {r['cpu']} | | | | | |")


def wait_metric(ok: Any, timeout: float = 10.0) -> None:
    import time as t

    end = t.monotonic() + timeout
    while not ok():
        if t.monotonic() > end:
            raise SystemExit("the quota change did not reach enqueue_svc within 10 s")
        t.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mails", type=int, default=200_000)
    p.add_argument("--end-to-end", action="store_true", help="unary and batched enqueue through gRPC, without and with quotas")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    if a.end_to_end:
        from bench.common import run

        run(lambda: end_to_end(a))
        return
    huge = dict(mails_per_s=1e9, burst_mails=10**9, bytes_per_s=1e12, burst_bytes=10**12)
    others = [quotas.Quota("tenant", f"t{i}", **huge) for i in range(500)] + [
        quotas.Quota("sender", f"s{i}@x.org", **huge) for i in range(500)]
    applying = [quotas.Quota("tenant", "acme", **huge), quotas.Quota("sender", "bob@example.com", **huge),
                quotas.Quota("sender_domain", "example.com", **huge), quotas.Quota("queue", "outbound", **huge)]
    print("| case | µs CPU per mail | of enqueue_svc's unary / batched CPU per mail |")
    print("|---|---|---|")
    for name, found in (("no quota", []), ("1,000 quotas, none applying", others), ("4 applying (mails + bytes each)", applying)):
        us = per_mail_us(keeper(found), a.mails)
        print(f"| {name} | {us:.1f} | {us / 10 / UNARY_MS:.2f} % / {us / 10 / BATCHED_MS:.2f} % |")


if __name__ == "__main__":
    main()
