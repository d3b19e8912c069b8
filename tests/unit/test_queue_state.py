"""Per-process caches (services/app/queue_state.py): a stale fact is read once for all who ask at
once; a change forgotten is never answered by a read begun before it."""

import asyncio
import types

from services.app.queue_state import QueueState
from tests.unit.aio import run


def view(reads: list[str]):
    async def current():
        reads.append("config")
        n = reads.count("config")  # this read's number, whatever runs beside it
        await asyncio.sleep(0)
        return f"config-{n}"

    async def policy(queue):
        reads.append(queue)
        await asyncio.sleep(0)
        return f"policy-{queue}-{len(reads)}"

    async def exists(queue):
        reads.append(f"exists {queue}")
        await asyncio.sleep(0)
        return True

    return types.SimpleNamespace(config=types.SimpleNamespace(current=current),
                                 retry_policies=types.SimpleNamespace(get=policy),
                                 queues=types.SimpleNamespace(exists=exists))


def test_callers_that_find_a_fact_stale_at_once_share_one_read():
    reads: list[str] = []

    async def main():
        state = QueueState(view(reads))
        configs = await asyncio.gather(*(state.config() for _ in range(20)))
        policies = await asyncio.gather(*(state.retry_policy("q") for _ in range(20)), state.retry_policy("other"))
        return configs, policies

    configs, policies = run(main())
    assert set(configs) == {"config-1"} and len(set(policies[:20])) == 1
    assert sorted(reads) == ["config", "other", "q"]


def test_a_queue_s_existence_is_read_by_each_caller():
    reads: list[str] = []

    async def main():
        state = QueueState(view(reads))
        await asyncio.gather(*(state.require_queue("q") for _ in range(3)))

    run(main())
    assert reads == ["exists q"] * 3


def test_after_forget_a_caller_reads_again_rather_than_join_the_read_under_way():
    reads: list[str] = []

    async def main():
        state = QueueState(view(reads))
        first = asyncio.ensure_future(state.config())
        await asyncio.sleep(0)  # its read is under way
        state.forget_config()  # the configuration changed meanwhile
        second = await state.config()
        return await first, second

    first, second = run(main())
    assert first == "config-1" and second == "config-2"
    assert reads == ["config", "config"]
