"""The unary-call coalescer (services/app/coalescer.py): pure asyncio, no backends."""

import asyncio

from services.app.coalescer import Coalescer


def test_a_lone_call_starts_at_once_and_calls_under_load_start_in_groups():
    async def scenario() -> tuple[list[int], list[int]]:
        c = Coalescer(window_s=0.5, size=4, busy=2)
        loop = asyncio.get_running_loop()
        release = asyncio.Event()
        started: list[float] = []

        async def call(i: int) -> int:
            started.append(loop.time())
            await release.wait()
            return i

        t0 = loop.time()
        first = [asyncio.ensure_future(c.run(lambda i=i: call(i))) for i in range(2)]  # under `busy`: at once
        await asyncio.sleep(0)
        assert len(started) == 2
        rest = [asyncio.ensure_future(c.run(lambda i=i: call(i))) for i in range(2, 9)]
        for _ in range(5):  # a few loop turns, no time: the full group of 4 starts, 3 wait for the window
            await asyncio.sleep(0)
        assert len(started) == 6 and loop.time() - t0 < 0.5
        deadline = loop.time() + 5
        while len(started) < 9 and loop.time() < deadline:  # the window opens the gate for the last 3
            await asyncio.sleep(0.01)
        assert len(started) == 9 and started[-1] - t0 >= 0.5
        release.set()
        results = await asyncio.gather(*first, *rest)
        return results, [round(s - t0, 2) for s in started]

    results, _ = asyncio.run(scenario())
    assert results == list(range(9))  # every call answered with its own result


def test_a_call_cancelled_while_waiting_leaves_the_others_alone():
    async def scenario() -> list[int]:
        c = Coalescer(window_s=0.02, size=10, busy=0)
        waiting = [asyncio.ensure_future(c.run(lambda i=i: asyncio.sleep(0, i))) for i in range(3)]
        await asyncio.sleep(0)
        waiting[1].cancel()
        done = await asyncio.gather(*waiting, return_exceptions=True)
        return [d for d in done if isinstance(d, int)]

    assert asyncio.run(scenario()) == [0, 2]
