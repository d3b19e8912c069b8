"""#47 item 2: one mail deleted (or moved) by its enqueue id, through gRPC and through the installed
mailq from another directory, where a unique prefix of the id does (like git's short hashes)."""

from __future__ import annotations

import uuid

import grpc
import pytest

from mailqueue.v1 import admin_pb2, enqueue_pb2
from services.domain.filters import MAX_ENQUEUE_IDS
from stack.harness import wait_until
from tests.integration.helpers import StreamConsumer, delivered, inline, message_count, simple_mail
from tests.integration.test_cli import mailq


def delete_ids(suite, queue: str, ids: list[str]) -> list[admin_pb2.DeleteProgress]:
    request = admin_pb2.DeleteMailsRequest(queue=queue, enqueue_ids=admin_pb2.EnqueueIds(ids=ids))
    return [r.progress for r in suite.admin_stub.DeleteMails(request, timeout=60)]


def move_ids(suite, source: str, target: str, ids: list[str], **conditions) -> admin_pb2.MoveMailsResponse:
    request = admin_pb2.MoveMailsRequest(queue=source, to_queue=target, enqueue_ids=ids, **conditions)
    return list(suite.admin_stub.MoveMails(request, timeout=60))[-1]


def enqueue_same_name(suite, queue: str, n: int, name: str = "hi.eml") -> list[str]:
    """``n`` mails all named ``name`` (as mailq named every mail of one file before), in one
    EnqueueBatches call; their enqueue ids."""
    many = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(name))) for i in range(n)]
    results = [r for b in suite.enqueue_stub.EnqueueBatches(iter([enqueue_pb2.EnqueueBatchesRequest(mails=many)]), timeout=120)
               for r in b.results]
    assert len(results) == n and all(r.HasField("receipt") for r in results), results[:3]
    return [r.receipt.enqueue_id for r in results]


def live_ids(suite, queue: str) -> list[str]:
    return [m.enqueue_id for m in suite.browsed_mails(queue)]


def test_a_delete_by_id_takes_one_of_two_mails_with_the_same_name_and_the_other_is_delivered(suite):
    queue = suite.new_queue()
    bad = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("hi.eml"))).receipt.enqueue_id
    good = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("hi.eml"))).receipt.enqueue_id
    # The same id twice (in another spelling) counts once; an id no mail of the queue has deletes nothing.
    progress = delete_ids(suite, queue, [bad, bad.upper(), str(uuid.uuid4())])
    assert progress[-1] == admin_pb2.DeleteProgress(scanned=1, deleted=1, done=True)
    assert live_ids(suite, queue) == [good]
    # Deleting it again (a retried call): nothing left to delete, not an error.
    assert delete_ids(suite, queue, [bad])[-1] == admin_pb2.DeleteProgress(scanned=0, deleted=0, done=True)
    # The other mail is delivered; the deleted one (enqueued first) is skipped by dequeue.
    c = StreamConsumer(suite.dequeue_stub, queue)
    d = c.next()
    assert d.mail.enqueue_id == good
    c.answer(d)
    wait_until(lambda: suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason="deleted") == 1,
               what="the deleted mail acked away by dequeue")
    wait_until(lambda: message_count(queue) == 0, what="the work queue empty")
    c.close()
    assert delivered(suite, queue) == 1 and live_ids(suite, queue) == []


def test_move_mails_by_id_moves_those_mails_only(suite):
    src, dst = suite.new_queue(), suite.new_queue()
    a, b, c = enqueue_same_name(suite, src, 3)
    last = move_ids(suite, src, dst, [a, c, str(uuid.uuid4())])
    assert (last.done, last.scanned, last.moved) == (True, 2, 2)
    assert live_ids(suite, src) == [b]
    moved = suite.browsed_mails(dst)
    assert len(moved) == 2 and not {m.enqueue_id for m in moved} & {a, b, c}  # new ids in the target
    # Ids combine with the other conditions (AND): b is not named "other", so it stays.
    assert move_ids(suite, src, dst, [b], name="other").moved == 0
    assert live_ids(suite, src) == [b]


def test_delete_by_id_reads_that_mails_row_only_at_depth(suite):
    """Cheap at any depth: the rows and marks read are the mail's own, not the queue's."""
    queue = suite.new_queue()
    ids = enqueue_same_name(suite, queue, 500)

    def counted() -> tuple[float, float]:
        return (suite.metric("browse", "mailqueue_view_rows_read_total", op="delete"),
                suite.metric("browse", "mailqueue_view_marks_read_total", op="delete"))

    rows0, marks0 = counted()
    assert delete_ids(suite, queue, [ids[321]])[-1].deleted == 1
    rows1, marks1 = counted()
    assert (rows1 - rows0, marks1 - marks0) == (1, 1)  # not the queue's 500
    assert suite.size(queue, exact=True) == 499 and ids[321] not in live_ids(suite, queue)


@pytest.mark.parametrize("ids,message", [
    (["not-a-uuid"], "'not-a-uuid' is not a UUID"),
    (["VALID", "0123"], "'0123' is not a UUID"),  # VALID: the queue's mail, which must not be deleted
    ([], "at least one enqueue id"),
    (["VALID"] + [str(uuid.uuid4()) for _ in range(MAX_ENQUEUE_IDS)], f"exceed the limit of {MAX_ENQUEUE_IDS}"),
])
def test_bad_ids_are_invalid_argument_and_nothing_is_deleted_or_moved(suite, ids, message):
    src, dst = suite.new_queue(), suite.new_queue()
    eid = suite.enqueue_stub.Enqueue(inline(src, simple_mail("stays"))).receipt.enqueue_id
    ids = [eid if i == "VALID" else i for i in ids]
    with pytest.raises(grpc.RpcError) as e:
        delete_ids(suite, src, ids)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details(), e.value.details()
    if ids:  # MoveMails: no ids is no id condition (every mail), not an error
        with pytest.raises(grpc.RpcError) as e:
            move_ids(suite, src, dst, ids)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details(), e.value.details()
    assert live_ids(suite, src) == [eid] and live_ids(suite, dst) == []


def test_mailq_deletes_by_a_unique_prefix_and_refuses_an_ambiguous_one(suite):
    queue, other = suite.new_queue(), suite.new_queue()
    # Random ids until two share their first 4 characters (about 320 on average), 100 at a time.
    ids: list[str] = []
    firsts: dict[str, str] = {}
    clash: tuple[str, str] | None = None
    while clash is None:
        assert len(ids) < 5000, "no two of 5,000 random UUIDs share 4 characters"
        batch = enqueue_same_name(suite, queue, 100)
        ids += batch
        for i in batch:
            if i[:4] in firsts and clash is None:
                clash = (firsts[i[:4]], i)
            firsts.setdefault(i[:4], i)
    a, b = clash
    # Ambiguous: refused (exit 1), both candidates listed, nothing deleted.
    r = mailq(suite, "delete", queue, "--id", a[:4], ok=False)
    assert r.returncode == 1 and "is ambiguous" in r.stderr and a in r.stderr and b in r.stderr, r.stderr
    assert suite.size(queue, exact=True) == len(ids)
    # A unique prefix (the shortest from 8 characters on, as browse prints 8) takes exactly that mail.
    n = next(k for k in range(8, 37) if sum(i.startswith(a[:k]) for i in ids) == 1)
    out = mailq(suite, "delete", queue, "--id", a[:n])
    assert "1 mail(s) deleted" in out.stdout
    assert suite.size(queue, exact=True) == len(ids) - 1 and a not in live_ids(suite, queue)
    # move --id takes prefixes too (browse --id: test_cli.py), and several ids in one command.
    n = next(k for k in range(8, 37) if sum(i.startswith(b[:k]) for i in ids) == 1)
    c = next(i for i in ids if i not in (a, b))
    assert "2 mail(s) moved" in mailq(suite, "move", queue, other, "--id", b[:n], c).stdout
    assert len(live_ids(suite, other)) == 2 and suite.size(queue, exact=True) == len(ids) - 3
    # A prefix no mail has: a clear error, nothing deleted.
    absent = next(p for p in (f"{k:08x}" for k in range(1 << 16)) if not any(i.startswith(p) for i in ids))
    r = mailq(suite, "delete", queue, "--id", absent, ok=False)
    assert f"no live mail of queue {queue} has an enqueue id starting with '{absent}'" in r.stderr
    assert suite.size(queue, exact=True) == len(ids) - 3
