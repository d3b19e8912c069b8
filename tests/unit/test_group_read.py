"""Grouped point reads (services/adapters/cassandra/group_read.py): who gets what, in how many requests."""

import asyncio
import uuid

import pytest

from services.adapters.cassandra.group_read import MAX_KEYS, GroupRead
from tests.unit.aio import run


def test_reads_of_one_turn_share_requests_and_each_caller_gets_its_own_row():
    keys = [uuid.uuid4() for _ in range(100)]
    present = {k: f"row-{i}" for i, k in enumerate(keys) if i % 3}
    requests = []

    async def fetch(queue, ids):
        requests.append((queue, len(ids)))
        return {k: present[k] for k in ids if k in present}

    async def main():
        reads = GroupRead(fetch)
        got = await asyncio.gather(*(reads.get("q", k) for k in keys), reads.get("other", keys[1]))
        return got

    got = run(main())
    assert got[:100] == [present.get(k) for k in keys] and got[100] == "row-1"
    assert sorted(requests) == sorted([("q", MAX_KEYS), ("q", 100 - MAX_KEYS), ("other", 1)])


def test_a_failed_read_fails_every_caller_of_its_group():
    async def fetch(queue, ids):
        raise ConnectionError("cassandra down")

    async def main():
        reads = GroupRead(fetch)
        return await asyncio.gather(*(reads.get("q", uuid.uuid4()) for _ in range(3)), return_exceptions=True)

    assert [type(e) for e in run(main())] == [ConnectionError] * 3


def test_a_read_alone_leaves_at_once():
    async def fetch(queue, ids):
        return {}

    async def main():
        reads = GroupRead(fetch)
        return await asyncio.wait_for(reads.get("q", uuid.uuid4()), timeout=1)

    assert run(main()) is None


@pytest.mark.parametrize("n", [1, MAX_KEYS, MAX_KEYS + 1])
def test_duplicate_keys_are_asked_once(n):
    key = uuid.uuid4()
    asked = []

    async def fetch(queue, ids):
        asked.append(list(ids))
        return {key: "row"}

    async def main():
        reads = GroupRead(fetch)
        return await asyncio.gather(*(reads.get("q", key) for _ in range(n)))

    assert run(main()) == ["row"] * n
    assert all(ids == [key] for ids in asked)
