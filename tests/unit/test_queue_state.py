"""Per-process caches (services/app/queue_state.py): a stale fact is read once for all who ask at
once; a change forgotten is never answered by a read begun before it."""

import asyncio
import types

from services.app.queue_state import QueueState
from tests.unit.aio import run


class Reads:
    """The view's reads as the cache makes them: each recorded, held until ``release`` is set."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def read(self, what: str) -> str:
        self.made.append(what)
        n = self.made.count(what)  # this read's number, whatever runs beside it
        self.started.set()
        await self.release.wait()
        return f"{what}-{n}"

    def view(self):
        async def exists(queue):
            return bool(await self.read(f"exists {queue}"))

        return types.SimpleNamespace(
            config=types.SimpleNamespace(current=lambda: self.read("config")),
            retry_policies=types.SimpleNamespace(get=lambda queue: self.read(f"policy {queue}")),
            queues=types.SimpleNamespace(exists=exists))


def test_callers_that_find_a_fact_stale_at_once_share_one_read():
    reads = Reads()

    async def main():
        state = QueueState(reads.view())
        asked = [asyncio.ensure_future(c) for c in
                 [*(state.config() for _ in range(20)), *(state.retry_policy("q") for _ in range(20)), state.retry_policy("other")]]
        await reads.started.wait()
        reads.release.set()
        return await asyncio.gather(*asked)

    answers = run(main())
    assert set(answers[:20]) == {"config-1"} and set(answers[20:40]) == {"policy q-1"} and answers[40] == "policy other-1"
    assert sorted(reads.made) == ["config", "policy other", "policy q"]


def test_a_queue_s_existence_is_read_by_each_caller():
    reads = Reads()

    async def main():
        state = QueueState(reads.view())
        asked = [asyncio.ensure_future(state.require_queue("q")) for _ in range(3)]
        await reads.started.wait()
        reads.release.set()
        await asyncio.gather(*asked)

    run(main())
    assert reads.made == ["exists q"] * 3


def test_after_forget_a_caller_reads_again_rather_than_join_the_read_under_way():
    reads = Reads()

    async def main():
        state = QueueState(reads.view())
        first = asyncio.ensure_future(state.config())
        await reads.started.wait()  # its read is under way
        state.forget_config()  # the configuration changed meanwhile
        second = asyncio.ensure_future(state.config())
        reads.release.set()
        return await first, await second

    assert run(main()) == ("config-1", "config-2")
    assert reads.made == ["config", "config"]
