"""#39: Browse at depth reads a page, not the queue, through gRPC on the real stack.

The rows and marks browse_svc reads are counted (its mailqueue_view_rows_read_total and
mailqueue_view_marks_read_total), not timed: the first page of a deep queue must read about one
page per bucket, and reading on must still give every mail once, in enqueue order; a Browse by
name must read that name's rows (an index), not the queue.
"""

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2
from tests.integration.helpers import fill, inline, simple_mail

DEPTH = 3000
FIRST_PAGE = 100  # services/app/browser.py: rows asked of each partition at first


def counted(suite, op: str) -> tuple[float, float]:
    return (suite.metric("browse", "mailqueue_view_rows_read_total", op=op),
            suite.metric("browse", "mailqueue_view_marks_read_total", op=op))


def test_the_first_page_of_a_deep_queue_reads_a_page_per_bucket_and_every_page_keeps_the_order(suite):
    queue = suite.new_queue()
    names = fill(suite, queue, DEPTH)
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
