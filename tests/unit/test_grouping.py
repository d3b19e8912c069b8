"""The unary-call grouper (services/app/grouping.py): pure asyncio, no backends."""

import asyncio
from collections.abc import Sequence

from services.app.grouping import Grouper


class Runner:
    """A GroupRunner from a function; it notes the withdrawn items."""

    def __init__(self, run_group) -> None:
        self.run_group = run_group
        self.withdrawn_items: list[int] = []

    def withdrawn(self, item: int) -> None:
        self.withdrawn_items.append(item)


def test_a_lone_call_runs_at_once_and_calls_that_arrive_meanwhile_run_as_the_next_group():
    async def scenario() -> tuple[list[int], list[list[int]]]:
        groups: list[list[int]] = []
        gates: list[asyncio.Event] = []

        async def run_group(items: Sequence[int]) -> list[int | BaseException]:
            groups.append(list(items))
            gate = asyncio.Event()
            gates.append(gate)
            await gate.wait()
            return [i * 10 for i in items]

        async def turns() -> None:  # a few loop turns, no time
            for _ in range(3):
                await asyncio.sleep(0)

        g: Grouper[int, int] = Grouper(Runner(run_group), running=1, size=4)
        first = asyncio.ensure_future(g.submit(0))  # nothing running: at once, alone
        await turns()
        assert groups == [[0]]
        rest = [asyncio.ensure_future(g.submit(i)) for i in range(1, 7)]
        await turns()
        assert groups == [[0]]  # they wait for the running group
        gates[0].set()
        await turns()
        assert groups == [[0], [1, 2, 3, 4]]  # the next group: the waiting ones, `size` at most
        gates[1].set()
        await turns()
        assert groups == [[0], [1, 2, 3, 4], [5, 6]]
        gates[2].set()
        return await asyncio.gather(first, *rest), groups

    results, groups = asyncio.run(scenario())
    assert results == [i * 10 for i in range(7)]  # every call answered with its own item's outcome


def test_each_call_gets_its_own_error_and_the_others_their_results():
    async def scenario() -> list[object]:
        async def run_group(items: Sequence[int]) -> list[int | BaseException]:
            return [ValueError(f"bad {i}") if i % 2 else i for i in items]

        g: Grouper[int, int] = Grouper(Runner(run_group), running=1, size=10)
        return await asyncio.gather(*(g.submit(i) for i in range(4)), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == 0 and outcomes[2] == 2
    assert [str(outcomes[1]), str(outcomes[3])] == ["bad 1", "bad 3"]


def test_a_call_cancelled_while_waiting_is_taken_out_of_its_group_and_its_runner_told():
    async def scenario() -> tuple[list[object], list[list[int]]]:
        groups: list[list[int]] = []

        async def run_group(items: Sequence[int]) -> list[int | BaseException]:
            groups.append(list(items))
            return list(items)

        runner = Runner(run_group)
        g: Grouper[int, int] = Grouper(runner, running=1, size=10)
        running = asyncio.ensure_future(g.submit(-1))  # runs at once; the next three wait for it
        waiting = [asyncio.ensure_future(g.submit(i)) for i in range(3)]
        await asyncio.sleep(0)
        waiting[1].cancel()
        await running
        done = await asyncio.gather(*waiting, return_exceptions=True)
        return [d for d in done if isinstance(d, int)], groups, runner.withdrawn_items

    answered, groups, withdrawn = asyncio.run(scenario())
    assert answered == [0, 2] and groups == [[-1], [0, 2]]  # the cancelled call's item was never run
    assert withdrawn == [1]  # and its runner heard of it (an idempotency claim to release)


def test_a_group_that_fails_as_a_whole_fails_each_of_its_calls():
    async def scenario() -> list[object]:
        async def run_group(items: Sequence[int]) -> list[int | BaseException]:
            raise ConnectionError("backend gone")

        g: Grouper[int, int] = Grouper(Runner(run_group), running=1, size=10)
        return await asyncio.gather(*(g.submit(i) for i in range(3)), return_exceptions=True)

    assert [type(o) for o in asyncio.run(scenario())] == [ConnectionError] * 3
