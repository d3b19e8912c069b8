"""#47.8: Browse and BrowseDeadLetters a page at a time (AIP-158), through gRPC on the real stack.

Mails enqueued in batches share enqueue instants (dozens per millisecond): paging by enqueue time
loops or skips there. A page token resumes right after the last mail of its page. Paging 3,000
mails, and what each page reads: tests/integration/test_browse_depth.py (its deep queue). Here:
paging while mails come and go, bad sizes and tokens, dead letters, and mailq.
"""

from __future__ import annotations

import collections
import json

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2
from stack.harness import wait_until
from tests.integration.helpers import StreamConsumer, inline, simple_mail
from tests.integration.test_cli import mailq

PAGE = 125
#: Mails per EnqueueBatches message.
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


def test_paging_while_mails_are_added_dequeued_and_deleted_skips_nothing_that_was_live_throughout(suite):
    # Given 500 mails enqueued in batches,
    queue = suite.new_queue()
    fill(suite, queue, [f"m-{i:04d}" for i in range(500)])
    names = [m.mail.name for m in suite.browsed_mails(queue)]  # in enqueue order (a batch's mails share instants)
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
        # The answers are settled before the next page (answered SUCCESS: marked gone, counted).
        wait_until(lambda: suite.size(queue) == 500 + len(added) - len(gone) - 51, 30, what="answers settled")
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
    everything = [m.enqueue_id for m in suite.browsed_mails(queue)]
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
    assert [m.enqueue_id for m in rest] == everything[2:] and last == ""


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
    names = suite.browsed_names(queue)
    lines = [json.loads(x) for x in mailq(suite, "browse", queue, "--json", "--page-size", "3").stdout.splitlines()]
    assert [x["mail"]["name"] for x in lines] == names[:3]
    token = lines[-1]["next_page_token"]
    assert all("next_page_token" not in x for x in lines[:-1])
    rest = [json.loads(x) for x in mailq(suite, "browse", queue, "--json", "--page-size", "3", "--page-token", token).stdout.splitlines()]
    assert [x["mail"]["name"] for x in rest] == names[3:] and "next_page_token" not in rest[-1]
    table = mailq(suite, "browse", queue, "--page-size", "2")
    assert names[1] in table.stdout and names[2] not in table.stdout and "next page: --page-token " in table.stderr
    bad = mailq(suite, "browse", queue, "--page-token", "nope", ok=False)
    assert "INVALID_ARGUMENT" in bad.stderr and "page_token" in bad.stderr


def test_positions_order_enqueue_ids_as_cassandra_clusters_them(suite):
    """Pages resume with "(enqueued_at, enqueue_id) > the token's", in Cassandra's order, and the
    buckets of a slice are merged in Python: both orders must agree, for the version-4 ids of
    enqueues and the version-5 ids a move or a redrive lands, in one millisecond."""
    import datetime as dt
    import uuid

    from services.domain.paging import Position

    table, probe = f"{suite.keyspace}.enqueued_mails_v1", f"id-order-{uuid.uuid4().hex[:8]}"  # a partition no queue has
    at = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc)
    ids = [uuid.uuid4() for _ in range(100)] + [uuid.uuid5(uuid.NAMESPACE_URL, f"moved-{i}") for i in range(100)]
    for i in ids:
        suite.view.session.execute(f"INSERT INTO {table} (queue_name, slice_start, bucket, enqueued_at, enqueue_id) "
                                   "VALUES (%s, %s, 0, %s, %s)", (probe, at, at, i))
    key = "WHERE queue_name = %s AND slice_start = %s AND bucket = 0"
    clustered = [r.enqueue_id for r in suite.view.session.execute(f"SELECT enqueue_id FROM {table} {key}", (probe, at))]
    assert clustered == sorted(ids, key=lambda i: Position.of(0, at, i))
    suite.view.session.execute(f"DELETE FROM {table} {key}", (probe, at))
