"""Enqueue quotas: the CPU one quota check costs enqueue_svc per mail (the check runs in the
process, no backend call), against what a mail costs enqueue_svc on the benchmarks page.

    .venv/bin/python -m bench.quota_bench [--mails 200000]

A QuotaKeeper is given a snapshot by hand (no store: the refresh runs once a second, not per
mail) and checks ``--mails`` mails in three cases: no quota at all; quotas that do not apply to the
mails (other tenants and senders, 1,000 of them); and four quotas that apply to every mail (its
tenant, sender, sender domain and queue, each with a mail and a byte rate, never binding).
"""

from __future__ import annotations

import argparse
import time

from services.app.quota_keeper import QuotaKeeper
from services.domain import quotas
from services.ports.quotas import QuotaSnapshot

#: CPU per mail in enqueue_svc, ms (docs/pages/benchmarks.md, "One Enqueue at a time", 10 KiB).
UNARY_MS, BATCHED_MS = 1.13, 0.58


def keeper(found: list[quotas.Quota]) -> QuotaKeeper:
    async def depth(_queue: str) -> int:
        return 0

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mails", type=int, default=200_000)
    a = p.parse_args()
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
