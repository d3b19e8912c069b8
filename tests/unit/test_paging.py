"""Page tokens and page ends (services/domain/paging.py): pure logic, no server."""

import asyncio
import datetime as dt
import uuid

import pytest

from services.domain import paging
from services.domain.errors import InvalidArgument
from services.domain.filters import BrowseFilter

UTC = dt.timezone.utc
AT = dt.datetime(2026, 11, 22, 10, 42, 7, 123000, tzinfo=UTC)
KEY = paging.request_key("spool", BrowseFilter(sender="a@example.com"))


def test_a_token_gives_back_the_position_it_was_made_of():
    p = paging.Position.of(1_795_000_000_000, AT, uuid.uuid4())
    token = paging.encode(paging.MAILS, KEY, p)
    assert paging.decode(paging.MAILS, KEY, token) == p
    assert token.isascii() and "=" not in token and "/" not in token and "+" not in token  # URL-safe as is


def test_positions_sort_by_partition_then_instant_then_enqueue_id():
    a, b = uuid.UUID(int=1), uuid.UUID(int=2)
    ordered = [paging.Position.of(0, AT, b), paging.Position.of(1, AT, a), paging.Position.of(1, AT, b),
               paging.Position.of(1, AT + dt.timedelta(milliseconds=1), a)]
    assert sorted(reversed(ordered)) == ordered


@pytest.mark.parametrize("token", ["x", "not base64 !", "", "AAAA", "A" * 56])
def test_a_token_that_is_not_ours_is_invalid_argument(token):
    with pytest.raises(InvalidArgument, match="not a token this listing returned|does not belong"):
        paging.decode(paging.MAILS, KEY, token or "=")


def test_a_token_for_another_request_or_listing_is_invalid_argument():
    token = paging.encode(paging.MAILS, KEY, paging.Position.of(0, AT, uuid.uuid4()))
    for kind, key in ((paging.MAILS, paging.request_key("spool", BrowseFilter(sender="b@example.com"))),
                      (paging.MAILS, paging.request_key("other", BrowseFilter(sender="a@example.com"))),
                      (paging.DEAD_LETTERS, KEY)):
        with pytest.raises(InvalidArgument, match="does not belong to this request"):
            paging.decode(kind, key, token)
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    with pytest.raises(InvalidArgument):
        paging.decode(paging.MAILS, KEY, flipped)


def test_the_call_instant_is_not_part_of_the_request():
    assert (paging.request_key("q", BrowseFilter(schedule="ready", now=AT))
            == paging.request_key("q", BrowseFilter(schedule="ready", now=AT + dt.timedelta(hours=1))))


@pytest.mark.parametrize("size", [-1, paging.MAX_PAGE_SIZE + 1])
def test_a_page_size_out_of_range_is_invalid_argument(size):
    with pytest.raises(InvalidArgument, match="page_size must be 0"):
        paging.request(size, "", 0, paging.MAILS, KEY)


def test_limit_does_not_combine_with_a_page():
    with pytest.raises(InvalidArgument, match="limit does not combine"):
        paging.request(10, "", 5, paging.MAILS, KEY)
    assert paging.request(0, "", 5, paging.MAILS, KEY) == paging.PageRequest()


def pages(items: list[int], size: int) -> list[tuple[int, str]]:
    async def gen():
        for i in items:
            yield i

    async def run():
        return [x async for x in paging.paged(gen(), size, lambda i: f"after-{i}")]

    return asyncio.run(run())


def test_a_full_page_that_more_items_follow_ends_with_the_token_on_its_last_item():
    assert pages([1, 2, 3, 4], 2) == [(1, ""), (2, "after-2")]


def test_the_last_page_has_no_token_even_when_full():
    assert pages([1, 2], 2) == [(1, ""), (2, "")]
    assert pages([1], 2) == [(1, "")]
    assert pages([], 2) == []


def test_no_page_size_lists_everything_without_a_token():
    assert pages([1, 2, 3], 0) == [(1, ""), (2, ""), (3, "")]


@pytest.mark.parametrize("partition,ms", [(0, 2**62), (2**62, 0), (-1, 0), (0, -1)])
def test_a_token_made_by_hand_with_an_impossible_position_is_refused(partition, ms):
    import base64
    body = paging._BODY.pack(1, paging.MAILS, partition, ms, uuid.uuid4().bytes)
    token = base64.urlsafe_b64encode(body + paging._digest(body, KEY)).decode().rstrip("=")
    with pytest.raises(InvalidArgument, match="a position no listing returns"):
        paging.decode(paging.MAILS, KEY, token)
