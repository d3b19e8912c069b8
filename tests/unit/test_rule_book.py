"""The rules as a process sees them (services/app/rule_book.py): read once per refresh, however
many deliveries ask at once."""

import asyncio

import pytest

from services.app.rule_book import RuleBook
from tests.unit.aio import run


class Store:
    """The rules' store as the book uses it: counts its reads; ``fail`` makes the next read fail."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail: Exception | None = None

    async def all(self):
        self.reads += 1
        await asyncio.sleep(0)  # the read is under way while the other callers ask
        if self.fail is not None:
            raise self.fail
        return []

    async def get(self, rule_id):
        return None


def test_callers_that_find_the_rules_stale_at_once_share_one_read():
    store = Store()

    async def main():
        book = RuleBook(store, refresh_s=60)
        await asyncio.gather(*(book.current() for _ in range(50)))
        await book.current()  # fresh now: no read
        book.forget()
        await asyncio.gather(*(book.current() for _ in range(5)))

    run(main())
    assert store.reads == 2


def test_a_failed_read_fails_each_waiting_caller_and_the_next_call_reads_again():
    store = Store()
    store.fail = ConnectionError("cassandra down")

    async def main():
        book = RuleBook(store, refresh_s=60)
        outcomes = await asyncio.gather(*(book.current() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(o, ConnectionError) for o in outcomes), outcomes
        store.fail = None
        return await book.current()

    assert run(main()) == []
    assert store.reads == 2


def test_a_cancelled_caller_does_not_cancel_the_read_others_wait_for():
    store = Store()

    async def main():
        book = RuleBook(store, refresh_s=60)
        first = asyncio.ensure_future(book.current())
        second = asyncio.ensure_future(book.current())
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    assert run(main()) == []
    assert store.reads == 1


def test_after_forget_a_caller_never_joins_the_read_begun_before_it():
    """A rule lifted while a read is under way: the second look reads again, so a rule still in
    force (here: the read after the lift finds the hold rule B) is applied, not skipped."""
    import datetime as dt
    import types

    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    lifted, kept = (types.SimpleNamespace(rule_id=i, expires_at=later) for i in ("lifted", "kept"))
    reads = []

    class Lifting(Store):
        async def all(self):
            n = len(reads)
            reads.append(n)
            await asyncio.sleep(0)
            return [lifted] if n == 0 else [kept]

    async def main():
        book = RuleBook(Lifting(), refresh_s=60)
        first = asyncio.ensure_future(book.current())  # the read that predates the lift
        await asyncio.sleep(0)
        book.forget()  # the caller found `lifted` gone
        again = await book.current()
        return await first, again, await book.current()

    before, again, cached = run(main())
    assert [r.rule_id for r in before] == ["lifted"]
    assert [r.rule_id for r in again] == ["kept"] and [r.rule_id for r in cached] == ["kept"]
    assert len(reads) == 2
