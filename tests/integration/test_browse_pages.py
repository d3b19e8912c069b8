"""#47.8: Browse and BrowseDeadLetters a page at a time (AIP-158), through gRPC on the real stack.

Mails enqueued in batches share enqueue instants (dozens per millisecond): paging by enqueue time
loops or skips there. A page token resumes right after the last mail of its page, so paging
gives every mail once, in the order of one unpaged Browse, and a deep page reads what it returns
(browse_svc's mailqueue_view_rows_read_total and mailqueue_view_marks_read_total, counted per page).
"""

from __future__ import annotations

import collections
import json

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2
from tests.harness import wait_until
from tests.integration.helpers import StreamConsumer, inline, simple_mail
from tests.integration.test_cli import mailq

DEPTH = 3000
PAGE = 100
#: Mails per EnqueueBatches message: 3,000 mails in about 2 s.
BATCH = 1000


def fill(suite, queue: str, names: list[str]) -> None:
    """``names`` in ``queue`` by EnqueueBatches (one stream, BATCH mails a message)."""
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(n))) for i, n in enumerate(names)]
    batches = [enqueue_pb2.EnqueueBatchesRequest(mails=many[k:k + BATCH]) for k in range(0, len(many), BATCH)]
    results = [r for b in suite.enqueue_stub.EnqueueBatches(iter(batches), timeout=120) for r in b.results]
    assert len(results) == len(names) and all(r.HasField("receipt") for r in results), results[:3]


def page(suite, queue: str, token: str = "", size: int = PAGE, **filters) -> tuple[list, str]:
    """One Browse page: its mails, and the next page's token (on its last message)."""
    responses = list(suite.browse_stub.Browse(
        browse_pb2.BrowseRequest(queue=queue, page_size=size, page_token=token, **filters), timeout=30))
    assert all(not r.next_page_token for r in responses[:-1])  # only the last message carries it
    return [r.mail for r in responses], responses[-1].next_page_token if responses else ""


def counted(suite) -> tuple[float, float]:
    return (suite.metric("browse", "mailqueue_view_rows_read_total", op="browse"),
            suite.metric("browse", "mailqueue_view_marks_read_total", op="browse"))


def test_paging_3000_mails_sharing_instants_gives_each_once_in_browse_order_and_each_page_reads_a_page(suite):
    # Given 3,000 mails enqueued in batches: many share an enqueue instant.
    queue = suite.new_queue()
    fill(suite, queue, [f"p-{i:05d}" for i in range(DEPTH)])
    everything = suite.browsed_mails(queue)
    per_instant = collections.Counter(m.enqueued_at.ToMilliseconds() for m in everything)
    print(f"{DEPTH} mails, {len(per_instant)} distinct instants, up to {max(per_instant.values())} in one ms")
    assert len(everything) == DEPTH and max(per_instant.values()) > 1
    buckets = suite.info(queue).configuration.bucket_count
    # When it is paged 100 at a time,
    paged, costs, token = [], [], ""
    while True:
        before = counted(suite)
        mails, token = page(suite, queue, token)
        after = counted(suite)
        costs.append((after[0] - before[0], after[1] - before[1]))
        paged.extend(mails)
        assert len(mails) == PAGE or not token  # only the last page may be short
        if not token:
            break
    # then every mail comes once, in the order of one unpaged Browse, in 30 full pages and no empty one,
    assert [m.enqueue_id for m in paged] == [m.enqueue_id for m in everything]
    assert len(costs) == DEPTH // PAGE
    # and the last page reads as little as the first: a page per bucket, the marks of one page (and the one after it).
    rows, marks = max(c[0] for c in costs), max(c[1] for c in costs)
    print(f"per page: at most {rows:.0f} rows (buckets {buckets}) and {marks:.0f} marks; last page {costs[-1]}")
    assert rows <= buckets * (PAGE + 1) and marks <= PAGE + 1, costs


def test_paging_while_mails_are_added_dequeued_and_deleted_skips_nothing_that_was_live_throughout(suite):
    # Given 1,000 mails enqueued in batches,
    queue = suite.new_queue()
    names = [f"m-{i:04d}" for i in range(1000)]
    fill(suite, queue, names)
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=64)
    seen: list[str] = []
    gone: set[str] = set()
    added: list[str] = []
    token, n = "", 0
    while True:
        mails, token = page(suite, queue, token)
        listed = [m.mail.name for m in mails]
        assert not set(listed) & gone, set(listed) & gone  # a mail gone before its page is not listed
        seen.extend(listed)
        if not token:
            break
        n += 1
        # Between pages: consumers take 50 mails, an operator deletes one further on (not listed
        # yet), producers add 20.
        taken = consumer.take(50)
        consumer.answer_all(taken)
        victim = names[-n]
        done = list(suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, name=victim), timeout=60))
        assert done[-1].progress.deleted == 1, victim
        # The answers are settled before the next page (answered SUCCESS: marked gone).
        wait_until(lambda: suite.size(queue, exact=True) == 1000 + len(added) - len(gone) - 51, 30, what="answers settled")
        gone.update({d.mail.mail.name for d in taken} | {victim})
        added += [f"new-{n:02d}-{i:02d}" for i in range(20)]
        fill(suite, queue, added[-20:])
    consumer.close()
    counts = collections.Counter(seen)
    # Then no mail is listed twice, and every mail live throughout is listed, in enqueue order,
    # and so is every mail added meanwhile (each comes after the position reached).
    assert max(counts.values()) == 1, counts.most_common(3)
    live_throughout = [x for x in names if x not in gone]
    assert [x for x in seen if x in set(live_throughout)] == live_throughout
    assert {x for x in added if x not in gone} <= set(seen)
    print(f"{n + 1} pages: {len(seen)} listed, {len(live_throughout)} live throughout, {len(gone)} gone "
          f"({n} deleted ahead of the pages), {len(added)} added")


def expect_invalid(call, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        list(call())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    for f in fragments:
        assert f in e.value.details(), e.value.details()


def test_bad_page_sizes_and_tokens_are_invalid_argument(suite):
    queue, other = suite.new_queue(), suite.new_queue()
    fill(suite, queue, [f"b-{i}" for i in range(5)])
    fill(suite, other, [f"b-{i}" for i in range(5)])
    _, token = page(suite, queue, size=2)
    assert token
    browse = lambda **r: suite.browse_stub.Browse(browse_pb2.BrowseRequest(**r), timeout=30)  # noqa: E731
    for size in (-1, 1001):
        expect_invalid(lambda: browse(queue=queue, page_size=size), "page_size must be 0", str(size))
    expect_invalid(lambda: browse(queue=queue, page_size=2, limit=3), "limit does not combine")
    expect_invalid(lambda: browse(queue=queue, page_token="garbage"), "not a token this listing returned")
    expect_invalid(lambda: browse(queue=queue, page_token=token[:-4]), "page_token")
    expect_invalid(lambda: browse(queue=other, page_token=token, page_size=2), "does not belong to this request")
    expect_invalid(lambda: browse(queue=queue, page_token=token, page_size=2, sender="x@example.com"), "does not belong")
    dead = lambda **r: suite.browse_stub.BrowseDeadLetters(browse_pb2.BrowseDeadLettersRequest(**r), timeout=30)  # noqa: E731
    expect_invalid(lambda: dead(queue=queue, page_size=-5), "page_size must be 0")
    expect_invalid(lambda: dead(queue=queue, page_size=1001), "page_size must be 0")
    expect_invalid(lambda: dead(queue=queue, page_size=2, limit=1), "limit does not combine")
    expect_invalid(lambda: dead(queue=queue, page_token=token), "does not belong")  # a Browse token
    # The same token, with only page_size changed, goes on where it left off.
    rest, last = page(suite, queue, token, size=10)
    assert [m.mail.name for m in rest] == ["b-2", "b-3", "b-4"] and last == ""


def test_dead_letters_sharing_instants_are_paged_once_each_in_order(suite):
    # Given 120 mails enqueued in batches (sharing instants), all rejected into dead letters,
    queue = suite.new_queue()
    fill(suite, queue, [f"d-{i:03d}" for i in range(120)])
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=128)
    taken = consumer.take(120)
    consumer.answer_all(taken, "REJECT")
    listing = lambda **r: list(suite.browse_stub.BrowseDeadLetters(  # noqa: E731
        browse_pb2.BrowseDeadLettersRequest(queue=queue, **r), timeout=30))
    wait_until(lambda: len(listing()) == 120, 60, what="120 dead letters")
    consumer.close()
    everything = [d.mail.enqueue_id for d in listing()]
    # when paged 25 at a time, then each comes once in the order of one unpaged listing.
    paged, token, pages = [], "", 0
    while True:
        responses = listing(page_size=25, page_token=token)
        assert all(not r.next_page_token for r in responses[:-1])
        paged += [d.mail.enqueue_id for d in responses]
        token, pages = responses[-1].next_page_token if responses else "", pages + 1
        if not token:
            break
    assert paged == everything and pages == 5


def test_mailq_browse_pages_with_page_token_and_json_carries_the_next_token(suite):
    queue = suite.new_queue()
    fill(suite, queue, [f"c-{i}" for i in range(5)])
    lines = [json.loads(x) for x in mailq(suite, "browse", queue, "--json", "--page-size", "3").stdout.splitlines()]
    assert [x["mail"]["name"] for x in lines] == ["c-0", "c-1", "c-2"]
    token = lines[-1]["next_page_token"]
    assert all("next_page_token" not in x for x in lines[:-1])
    rest = [json.loads(x) for x in mailq(suite, "browse", queue, "--json", "--page-size", "3", "--page-token", token).stdout.splitlines()]
    assert [x["mail"]["name"] for x in rest] == ["c-3", "c-4"] and "next_page_token" not in rest[-1]
    table = mailq(suite, "browse", queue, "--page-size", "2")
    assert "c-1" in table.stdout and "c-2" not in table.stdout and "next page: --page-token " in table.stderr
    bad = mailq(suite, "browse", queue, "--page-token", "nope", ok=False)
    assert "INVALID_ARGUMENT" in bad.stderr and "page_token" in bad.stderr
