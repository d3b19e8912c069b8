"""The unary-call grouper (services/app/enqueue_group.py): pure asyncio, no backends."""

import asyncio
import dataclasses
from collections.abc import Sequence

from services.app.enqueue_group import Grouper


class Runner:
    """GroupWrites' part the grouper calls, from a function."""

    def __init__(self, run_group) -> None:
        self.run_group = run_group


class Compensation:
    """Compensation's part the grouper calls: it notes the claims released."""

    def __init__(self) -> None:
        self.released: list[str] = []

    def undo_later(self, queue, key, enqueue_id, started, taken_over=False) -> None:
        self.released.append(key)


@dataclasses.dataclass(frozen=True)
class Mail:
    """What the grouper reads of a waiting mail: its idempotency key ("": none)."""

    n: int
    key: str = ""
    queue: str = "q"
    enqueue_id: None = None
    started: None = None
    at: None = None
    taken_over: bool = False


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

        g: Grouper[int, int] = Grouper(Runner(run_group), Compensation(), running=1, size=4)
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

        g: Grouper[int, int] = Grouper(Runner(run_group), Compensation(), running=1, size=10)
        return await asyncio.gather(*(g.submit(i) for i in range(4)), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == 0 and outcomes[2] == 2
    assert [str(outcomes[1]), str(outcomes[3])] == ["bad 1", "bad 3"]


def test_a_call_cancelled_while_waiting_is_taken_out_of_its_group_and_its_claim_released():
    async def scenario() -> tuple[list[object], list[list[int]], list[str]]:
        groups: list[list[int]] = []

        async def run_group(items: Sequence[Mail]) -> list[int | BaseException]:
            groups.append([m.n for m in items])
            return [m.n for m in items]

        compensation = Compensation()
        g = Grouper(Runner(run_group), compensation, running=1, size=10)
        running = asyncio.ensure_future(g.submit(Mail(-1)))  # runs at once; the next four wait for it
        waiting = [asyncio.ensure_future(g.submit(Mail(i, key=f"k{i}" if i < 3 else ""))) for i in range(4)]
        await asyncio.sleep(0)
        waiting[1].cancel()
        waiting[3].cancel()  # no key: nothing to release
        await running
        done = await asyncio.gather(*waiting, return_exceptions=True)
        return [d for d in done if isinstance(d, int)], groups, compensation.released

    answered, groups, released = asyncio.run(scenario())
    assert answered == [0, 2] and groups == [[-1], [0, 2]]  # the cancelled calls' mails were never run
    assert released == ["k1"]  # and the keyed one's idempotency claim is released


def test_a_group_that_fails_as_a_whole_fails_each_of_its_calls():
    async def scenario() -> list[object]:
        async def run_group(items: Sequence[int]) -> list[int | BaseException]:
            raise ConnectionError("backend gone")

        g: Grouper[int, int] = Grouper(Runner(run_group), Compensation(), running=1, size=10)
        return await asyncio.gather(*(g.submit(i) for i in range(3)), return_exceptions=True)

    assert [type(o) for o in asyncio.run(scenario())] == [ConnectionError] * 3
