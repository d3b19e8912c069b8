"""#39: Browse at depth reads a page, not the queue, through gRPC on the real stack.

The rows and marks browse_svc reads are counted (its mailqueue_view_rows_read_total and
mailqueue_view_marks_read_total), not timed: the first page of a deep queue must read about one
page per bucket, and reading on must still give every mail once, in enqueue order; a Browse by
name must read that name's rows (an index), not the queue. Paged (page_size, page_token), every
page reads about as much as the first, and the pages give every mail once, in the order of one
unpaged Browse, though a batch's mails share enqueue instants.
"""

import collections

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2
from tests.integration.helpers import fill, inline, simple_mail

DEPTH = 3000
FIRST_PAGE = 100  # services/app/browser.py: rows asked of each partition at first
PAGE = 100  # a page_size


def counted(suite, op: str) -> tuple[float, float]:
    return (suite.metric("browse", "mailqueue_view_rows_read_total", op=op),
            suite.metric("browse", "mailqueue_view_marks_read_total", op=op))


def paged_with_costs(suite, queue: str) -> tuple[list, list[tuple[float, float]]]:
    """Every mail of the queue, Browsed PAGE at a time, and the (rows, marks) each page read;
    only a page's last message carries the token, and only the last page may be short."""
    paged, costs, token = [], [], ""
    while True:
        rows0, marks0 = counted(suite, "browse")
        responses = list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, page_size=PAGE, page_token=token)))
        rows1, marks1 = counted(suite, "browse")
        costs.append((rows1 - rows0, marks1 - marks0))
        assert all(not r.next_page_token for r in responses[:-1])
        token = responses[-1].next_page_token
        assert len(responses) == PAGE or not token
        paged += [r.mail for r in responses]
        if not token:
            return paged, costs


@pytest.fixture(scope="module")
def deep(suite) -> tuple[str, list[str]]:
    """A queue of DEPTH mails enqueued by EnqueueBatches (their names), read and paged by the tests
    below without changing it."""
    queue = suite.new_queue()
    return queue, fill(suite, queue, DEPTH)


def test_the_first_page_of_a_deep_queue_reads_a_page_per_bucket_and_every_page_keeps_the_order(suite, deep):
    queue, names = deep
    buckets = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info.configuration.bucket_count
    rows0, marks0 = counted(suite, "browse")
    page = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, limit=10))]
    rows1, marks1 = counted(suite, "browse")
    assert 10 <= rows1 - rows0 <= buckets * FIRST_PAGE < DEPTH, (rows1 - rows0, buckets)
    assert 10 <= marks1 - marks0 <= FIRST_PAGE, marks1 - marks0
    # Read on to the end: every mail once, in enqueue order (the mails of one batch are enqueued
    # concurrently: their order is their enqueue time's), the first page its beginning.
    everything = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))]
    assert sorted(m.mail.name for m in everything) == names
    times = [m.enqueued_at.ToDatetime() for m in everything]
    assert times == sorted(times)
    assert [m.enqueue_id for m in page] == [m.enqueue_id for m in everything[:10]]
    rows2, _ = counted(suite, "browse")
    assert rows2 - rows1 == DEPTH


def test_paging_a_deep_queue_of_batches_gives_each_mail_once_in_browse_order_and_each_page_reads_a_page(suite, deep):
    """#47.8: paged 100 at a time (page_size, page_token), the batches' mails sharing instants."""
    queue, _ = deep
    everything = suite.browsed_mails(queue)
    per_instant = collections.Counter(m.enqueued_at.ToMilliseconds() for m in everything)
    print(f"{DEPTH} mails, {len(per_instant)} distinct instants, up to {max(per_instant.values())} in one ms")
    assert len(everything) == DEPTH and max(per_instant.values()) > 1
    buckets = suite.info(queue).configuration.bucket_count
    paged, costs = paged_with_costs(suite, queue)
    # Every mail once, in the order of one unpaged Browse, in 30 full pages (none empty),
    assert [m.enqueue_id for m in paged] == [m.enqueue_id for m in everything]
    assert len(costs) == DEPTH // PAGE
    # and the last page reads as little as the first: a page per bucket, the marks of one page and
    # of the mail after it (is there a next page?).
    rows, marks = max(c[0] for c in costs), max(c[1] for c in costs)
    print(f"per page: at most {rows:.0f} rows ({buckets} buckets) and {marks:.0f} marks; the last page {costs[-1]}")
    assert rows <= buckets * (PAGE + 1) and marks <= PAGE + 1, costs


def test_browse_by_name_reads_that_names_rows_only_and_not_once_it_is_deleted(suite):
    queue, other = suite.new_queue(), suite.new_queue()
    names = fill(suite, queue, DEPTH)
    wanted = names[1234]
    suite.enqueue_stub.Enqueue(inline(other, simple_mail(wanted)))  # the same name in another queue
    rows0, marks0 = counted(suite, "browse")
    found = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, name=wanted))]
    rows1, marks1 = counted(suite, "browse")
    assert [m.mail.name for m in found] == [wanted] and found[0].queue == queue
    assert (rows1 - rows0, marks1 - marks0) == (1, 1)  # its row and its mark: not the queue's 3,000
    deleted = [r.progress for r in suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, name=wanted))]
    assert deleted[-1].deleted == 1
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, name=wanted))) == []
    assert [r.mail.mail.name for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=other, name=wanted))] == [wanted]


def test_a_page_of_a_name_many_mails_share_reads_a_page_of_marks(suite):
    """A name a campaign gives every mail: a page of it reads the marks of a page, not of every
    mail of the name (before: every one, for every page)."""
    queue, shared, n = suite.new_queue(), "campaign", 600
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(shared))) for i in range(n)]
    batches = [enqueue_pb2.EnqueueBatchesRequest(mails=many[k:k + 200]) for k in range(0, n, 200)]
    assert sum(len(b.results) for b in suite.enqueue_stub.EnqueueBatches(iter(batches), timeout=120)) == n
    everything = [m.enqueue_id for m in suite.browsed_mails(queue, name=shared)]
    assert len(everything) == n
    paged, token, costs = [], "", []
    while True:
        rows0, marks0 = counted(suite, "browse")
        got = list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, name=shared, page_size=50, page_token=token)))
        rows1, marks1 = counted(suite, "browse")
        costs.append(marks1 - marks0)
        paged += [r.mail.enqueue_id for r in got]
        token = got[-1].next_page_token
        if not token:
            break
    assert paged == everything  # every mail once, in Browse order
    assert len(costs) == n // 50 and max(costs) <= 51, costs  # a page's marks and the next one's: not the name's 600


def test_browse_by_enqueue_id_reads_that_mails_row_only(suite):
    queue, other = suite.new_queue(), suite.new_queue()
    fill(suite, queue, DEPTH)
    wanted = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("by-id"))).receipt.enqueue_id
    elsewhere = suite.enqueue_stub.Enqueue(inline(other, simple_mail("by-id"))).receipt.enqueue_id
    rows0, marks0 = counted(suite, "browse")
    found = [r.mail for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=wanted))]
    rows1, marks1 = counted(suite, "browse")
    assert [(m.enqueue_id, m.queue, m.mail.name) for m in found] == [(wanted, queue, "by-id")]
    assert (rows1 - rows0, marks1 - marks0) == (1, 1)  # its row and its mark: not the queue's 3,001
    # Another queue's mail is not this queue's; an id no mail has finds nothing.
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=elsewhere))) == []
    unknown = "00000000-0000-4000-8000-000000000000"
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=unknown))) == []
    # Combined filters still apply (AND): the right id with another name is no match.
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=wanted, name="x"))) == []
    deleted = [r.progress for r in suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, name="by-id"))]
    assert deleted[-1].deleted == 1
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id=wanted))) == []


def test_browse_by_an_enqueue_id_that_is_not_a_uuid_is_invalid_argument(suite):
    queue = suite.new_queue()
    with pytest.raises(grpc.RpcError) as e:
        list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, enqueue_id="not-a-uuid")))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not-a-uuid" in e.value.details() and "not a UUID" in e.value.details()


def test_a_page_that_spans_slices_reads_a_page_not_a_page_per_slice(fast_suite):
    """A page whose mails lie in two slices (here 1 s wide) reads the rest of the first and only
    what is missing of the next (a page that crossed a slice's end read 193 rows for 100)."""
    from tests.integration.test_browse_admin import next_slice

    s = fast_suite
    queue = s.new_queue()
    names = []
    for part in range(3):  # 3 slices of 150 mails: pages of 100 start and end inside slices
        next_slice()
        names += fill(s, queue, 150, prefix=f"s{part}")
    buckets = s.info(queue).configuration.bucket_count
    mails, costs = paged_with_costs(s, queue)
    paged = [m.mail.name for m in mails]
    print(f"{len(paged)} mails in 3 slices, pages of {PAGE}: rows and marks read per page {costs}")
    assert len(paged) == len(names) and sorted(paged) == names  # each once (a batch's order is its instants')
    assert all(rows <= buckets * (PAGE + 1) and marks <= PAGE + 1 for rows, marks in costs), costs
