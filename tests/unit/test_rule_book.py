"""The rules as a process sees them (services/app/rule_book.py): read once per refresh, however
many deliveries ask at once; after a forget, never answered by a read begun before it."""

import asyncio
import datetime as dt
import types

import pytest

from services.app.rule_book import RuleBook
from tests.unit.aio import run


class Store:
    """The rules' store as the book uses it: each read counted, held until ``release`` is set;
    ``answers`` gives each read's rules in turn; ``fail`` makes the reads fail."""

    def __init__(self, answers=None) -> None:
        self.reads = 0
        self.fail: Exception | None = None
        self.answers = list(answers or [])
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def all(self):
        n = self.reads
        self.reads += 1
        self.started.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.answers[n] if n < len(self.answers) else []

    async def get(self, rule_id):
        return None


async def asking(book: RuleBook, store: Store, n: int) -> list:
    """``n`` callers ask at once, while the read is held; then it is released."""
    store.release.clear()
    callers = [asyncio.ensure_future(book.current()) for _ in range(n)]
    await store.started.wait()
    store.release.set()
    return await asyncio.gather(*callers, return_exceptions=True)


def test_callers_that_find_the_rules_stale_at_once_share_one_read():
    async def main():
        store = Store()
        book = RuleBook(store, refresh_s=60)
        await asking(book, store, 50)
        await book.current()  # fresh now: no read
        book.forget()
        store.started.clear()
        await asking(book, store, 5)
        return store.reads

    assert run(main()) == 2


def test_a_failed_read_fails_each_waiting_caller_and_the_next_call_reads_again():
    async def main():
        store = Store()
        store.fail = ConnectionError("cassandra down")
        book = RuleBook(store, refresh_s=60)
        outcomes = await asking(book, store, 3)
        store.fail = None
        return outcomes, await book.current(), store.reads

    outcomes, rules, reads = run(main())
    assert all(isinstance(o, ConnectionError) for o in outcomes), outcomes
    assert rules == [] and reads == 2


def test_a_cancelled_caller_does_not_cancel_the_read_others_wait_for():
    async def main():
        store = Store()
        book = RuleBook(store, refresh_s=60)
        first = asyncio.ensure_future(book.current())
        second = asyncio.ensure_future(book.current())
        await store.started.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        store.release.set()
        return await second, store.reads

    assert run(main()) == ([], 1)


def test_after_forget_a_caller_never_joins_the_read_begun_before_it():
    """A rule lifted while a read is under way: the second look reads again, so a rule still in
    force (the read after the lift finds the hold rule "kept") is applied, not skipped."""
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    lifted, kept = (types.SimpleNamespace(rule_id=i, expires_at=later) for i in ("lifted", "kept"))

    async def main():
        store = Store(answers=[[lifted], [kept]])
        book = RuleBook(store, refresh_s=60)
        first = asyncio.ensure_future(book.current())  # the read that predates the lift
        await store.started.wait()
        book.forget()  # the caller found `lifted` gone
        again = asyncio.ensure_future(book.current())
        store.release.set()
        return await first, await again, await book.current(), store.reads

    before, again, cached, reads = run(main())
    assert [r.rule_id for r in before] == ["lifted"]
    assert [r.rule_id for r in again] == ["kept"] and [r.rule_id for r in cached] == ["kept"]
    assert reads == 2
