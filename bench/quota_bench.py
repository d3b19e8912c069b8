"""Enqueue quotas: the CPU one quota check costs enqueue_svc per mail (the check runs in the
process, no backend call), against what a mail costs enqueue_svc on the benchmarks page.

    .venv/bin/python -m bench.quota_bench [--mails 200000]
    .venv/bin/python -m bench.quota_bench --end-to-end [--seconds 10] [--warmup 3] [--concurrency 64] [--batch 32]
    .venv/bin/python -m bench.quota_bench --fairness [--rounds 6] [--seconds 10] [--beta-rate 100] [--acme-rate 20] [--over 10] [--workers 1]
        [--acme-backs-off]

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

``--fairness``: one tenant over its rate beside one under it (the quotas page's promise). With
access control on (tokens naming the tenants ``acme`` and ``beta``), acme gets a rate of
``--acme-rate`` mails/s; beta one it never reaches. Beta sends paced unary Enqueues at
``--beta-rate`` for ``--seconds`` per round, in rounds that rotate three cases: beta alone; acme
beside it at its own rate (all accepted: the load the quota allows); acme beside it offering
``--over`` times its rate (the excess refused). Beta's p99 is compared between the cases, over
every round of each, and beta's refusals counted (there must be none). ``--acme-backs-off``: acme's
client acts on each refusal's RetryInfo (makes no call until its ``retry_delay`` has passed; the
calls it would have made meanwhile are counted as deferred), as the quotas page asks of clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
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


ACME, BETA, OPERATOR = "acmeacmeacmeacme0001", "betabetabetabeta0002", "operatoroperator0003"


def fairness(a: argparse.Namespace) -> None:
    import grpc

    from bench import enqueue_bench as eb
    from bench.common import PORTS, bench_queue, metric, new_keyspace, settle, start_services, stop, tree_cpu_seconds
    from mailqueue.v1 import admin_pb2, admin_pb2_grpc, quotas_pb2

    tokens = f"producer@acme:{ACME},producer@beta:{BETA},admin:{OPERATOR}"
    procs = start_services(new_keyspace(), ["blob", "enqueue", "browse"], metrics={"enqueue": eb.ENQUEUE_METRICS},
                           extra={"MAILQUEUE_TOKENS": tokens, "MAILQUEUE_WORKERS": str(a.workers)})
    operator = (("authorization", f"Bearer {OPERATOR}"),)
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{PORTS['browse']}"))
    queue = bench_queue("bench-fair")
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue), metadata=operator)
    for tenant, rate in (("acme", a.acme_rate), ("beta", 1e6)):
        q = quotas_pb2.Quota(kind=quotas_pb2.QUOTA_KIND_TENANT, subject=tenant, mails_per_s=rate, burst_mails=max(1, int(rate / 4)))
        admin.SetQuota(admin_pb2.SetQuotaRequest(quota=q), metadata=operator)
    # the limit gauge has a series per worker (services/runtime/workers.py): every one has the quota
    wait_metric(lambda: metric(eb.ENQUEUE_METRICS, "mailqueue_quota_limit", kind="tenant", subject="acme") == a.acme_rate * a.workers)
    async def round_(case: str) -> tuple[list[float], list[str], list[str], float]:
        """Beta's calls from this process; acme's from a process of its own (as another tenant's
        client would be: its client work does not slow beta's); enqueue_svc's CPU over the round."""
        acme_rate = {"alone": 0.0, "acme at its rate": a.acme_rate * 0.9, "acme over": a.acme_rate * a.over}[case]
        acme = subprocess.Popen([sys.executable, "-m", "bench.quota_bench", "--acme-load", str(acme_rate), "--queue", queue,
                                 "--seconds", str(a.seconds), *(["--acme-backs-off"] if a.acme_backs_off else [])],
                                stdout=subprocess.PIPE, text=True) if acme_rate else None
        cpu = tree_cpu_seconds(procs[1].pid)  # with its workers
        lat, codes = await paced(queue, "fair", BETA, a.beta_rate, a.seconds)
        acme_codes = json.loads(acme.communicate(timeout=120)[0]) if acme else []
        return lat, codes, acme_codes, tree_cpu_seconds(procs[1].pid) - cpu

    cases = ("alone", "acme at its rate", "acme over")
    beta: dict[str, list[float]] = {c: [] for c in cases}
    per_round: dict[str, list[float]] = {c: [] for c in cases}
    beta_refused: dict[str, int] = dict.fromkeys(cases, 0)
    acme_refused: dict[str, int] = dict.fromkeys(cases, 0)
    acme_deferred: dict[str, int] = dict.fromkeys(cases, 0)
    enqueue_cpu: dict[str, float] = dict.fromkeys(cases, 0.0)
    try:
        settle("fairness", SETTLE_S)
        asyncio.run(paced(queue, "fair", BETA, a.beta_rate, a.warmup))
        for r in range(a.rounds):
            for case in cases[r % 3:] + cases[:r % 3]:  # each case first, second and third in turn
                lat, codes, acme_codes, cpu = asyncio.run(round_(case))
                enqueue_cpu[case] += cpu
                beta[case].extend(lat)
                per_round[case].append(p99(lat))
                beta_refused[case] += codes.count("RESOURCE_EXHAUSTED")
                acme_refused[case] += acme_codes.count("RESOURCE_EXHAUSTED")
                acme_deferred[case] += acme_codes.count("DEFERRED")
                print(f"  round {r + 1} {case}: beta {len(lat)} ok, p99 {1000 * p99(lat):.1f} ms, errors {codes[:3]}; "
                      f"acme refused {acme_codes.count('RESOURCE_EXHAUSTED')}, deferred {acme_codes.count('DEFERRED')}", flush=True)
    finally:
        stop(procs)
    print(f"\nbeta {a.beta_rate:.0f} mails/s (10 KiB, unary, paced), acme's rate {a.acme_rate:.0f}/s; {a.rounds} rounds of "
          f"{a.seconds:.0f} s per case, the cases rotated; enqueue_svc with {a.workers} worker(s)"
          f"{'; acme backs off as RetryInfo says' if a.acme_backs_off else ''}")
    print("| case | beta mails | beta p50 ms | beta p99 ms | of alone | median of per-round p99 ms | beta refused | acme refused "
          "| acme deferred | enqueue_svc CPU, share of a core |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        print(f"| {case} | {len(beta[case])} | {1000 * pct(beta[case], 0.5):.1f} | {1000 * p99(beta[case]):.1f} | "
              f"{p99(beta[case]) / p99(beta['alone']):.3f} | {1000 * sorted(per_round[case])[len(per_round[case]) // 2]:.1f} | "
              f"{beta_refused[case]} | {acme_refused[case]} | {acme_deferred[case]} | {enqueue_cpu[case] / (a.rounds * a.seconds):.2f} |")


def acme_load(a: argparse.Namespace) -> None:
    """``--acme-load RATE``: acme's paced unary Enqueues for ``--seconds``; prints the codes of the
    calls that failed, as JSON (with ``--acme-backs-off``, a "DEFERRED" for each call not made)."""
    print(json.dumps(asyncio.run(paced(a.queue, "fair-acme", ACME, a.acme_load, a.seconds, backs_off=a.acme_backs_off))[1]))


async def paced(queue: str, name: str, token: str, rate: float, seconds: float,
                backs_off: bool = False) -> tuple[list[float], list[str]]:
    """Unary Enqueues of 10 KiB at ``rate`` a second for ``seconds`` (started on time whatever the
    answers take), with ``token``: the latencies of the calls answered OK, the codes of the others.
    ``backs_off``: a client that acts on a refusal's RetryInfo, as the quotas page asks: no call
    until its ``retry_delay`` has passed (each call it would have made meanwhile: "DEFERRED")."""
    import grpc
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    from bench import enqueue_bench as eb
    from bench.common import PORTS
    from mailqueue.v1 import enqueue_pb2, enqueue_pb2_grpc, mail_pb2

    mail = mail_pb2.Mail(name=name, sender="a@example.com", recipients=["b@example.org"])
    auth = (("authorization", f"Bearer {token}"),)
    latencies: list[float] = []
    codes: list[str] = []
    resume_at = 0.0  # the loop's time before which a client that backs off makes no call
    async with grpc.aio.insecure_channel(f"127.0.0.1:{PORTS['enqueue']}") as channel:
        stub = enqueue_pb2_grpc.EnqueueServiceStub(channel)

        async def one(i: int) -> None:
            nonlocal resume_at
            began = time.perf_counter()
            try:
                await stub.Enqueue(enqueue_pb2.EnqueueRequest(queue=queue, mail=mail, inline_content=eb.content(i, 10_240)),
                                   metadata=auth, timeout=30)
                latencies.append(time.perf_counter() - began)
            except grpc.aio.AioRpcError as e:
                codes.append(e.code().name)
                status = rpc_status.from_call(e) if backs_off else None
                for detail in status.details if status is not None else ():
                    if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                        info = error_details_pb2.RetryInfo()
                        detail.Unpack(info)
                        resume_at = max(resume_at, loop.time() + info.retry_delay.ToTimedelta().total_seconds())

        loop, calls = asyncio.get_running_loop(), []
        start = loop.time()
        for i in range(int(rate * seconds)):
            wait = start + i / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if loop.time() < resume_at:
                codes.append("DEFERRED")
                continue
            calls.append(asyncio.ensure_future(one(i)))
        await asyncio.gather(*calls)
    return latencies, codes


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def p99(values: list[float]) -> float:
    return pct(values, 0.99)


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
    p.add_argument("--fairness", action="store_true", help="a tenant under its rate beside one over it (p99s)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--beta-rate", type=float, default=100)
    p.add_argument("--acme-rate", type=float, default=20)
    p.add_argument("--over", type=float, default=10)
    p.add_argument("--workers", type=int, default=1, help="--fairness: enqueue_svc's worker processes (MAILQUEUE_WORKERS)")
    p.add_argument("--acme-backs-off", action="store_true",
                   help="--fairness: acme's client acts on RetryInfo (no call until retry_delay has passed)")
    p.add_argument("--acme-load", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--queue", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.acme_load:
        acme_load(a)
        return
    if a.fairness:
        from bench.common import run

        run(lambda: fairness(a))
        return
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
