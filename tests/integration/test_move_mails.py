"""MoveMails (mailq move) through gRPC and the installed CLI: mails keep their age, schedule,
attempts and content; bad input moves nothing; a SIGKILL of browse_svc mid-move loses nothing and
delivers nothing from both queues once a second MoveMails completed the journal."""

from __future__ import annotations

import collections
import datetime as dt
import queue as q
import queue as q_mod

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2
from services.app import admin_events
from stack.harness import ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, inline, kill_9_mid_stream, simple_mail
from tests.integration.test_cli import mailq


def move(stub, source: str, target: str, **conditions) -> list[admin_pb2.MoveMailsResponse]:
    return list(stub.MoveMails(admin_pb2.MoveMailsRequest(queue=source, to_queue=target, **conditions), timeout=120))


@pytest.mark.parametrize("source,target,extra,code", [
    ("same", "same", {}, "INVALID_ARGUMENT"),
    ("src", "bad name!", {}, "INVALID_ARGUMENT"),
    ("src", "no-such-queue-5c1e", {}, "NOT_FOUND"),
    ("no-such-queue-5c1e", "dst", {}, "NOT_FOUND"),
    ("src", "dst", {"schedule": 99}, "INVALID_ARGUMENT"),
])
def test_bad_input_is_refused_and_moves_nothing(suite, source, target, extra, code):
    src, dst = suite.new_queue(), suite.new_queue()
    names = {"same": src, "src": src, "dst": dst}
    suite.enqueue_stub.Enqueue(inline(src, simple_mail("stays")))
    with pytest.raises(grpc.RpcError) as e:
        move(suite.admin_stub, names.get(source, source), names.get(target, target), **extra)
    assert e.value.code().name == code, e.value.details()
    assert list(suite.browsed_by_name(src)) == ["stays"] and suite.browsed_by_name(dst) == {}


def test_a_move_keeps_age_schedule_attempts_and_content(suite):
    src, dst = suite.new_queue(), suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(src, simple_mail("ready", recipients=["x@example.net"]), b"Subject: ready\r\n\r\nbody one"))
    later = inline(src, simple_mail("later", recipients=["x@example.net"]))
    later.delay.FromTimedelta(dt.timedelta(hours=1))
    suite.enqueue_stub.Enqueue(later)
    suite.enqueue_stub.Enqueue(inline(src, simple_mail("retried", recipients=["x@example.net"])))
    suite.enqueue_stub.Enqueue(inline(src, simple_mail("other", recipients=["y@example.org"])))
    # "retried" gets one RETRY an hour away (the others are handed back unanswered).
    c = StreamConsumer(suite.dequeue_stub, src)
    for d in c.take(3):
        if d.mail.mail.name == "retried":
            c.answer(d, "RETRY", "451 4.3.0 try later", retry_after=3600)
    c.close()
    wait_until(lambda: suite.browsed_by_name(src)["retried"].attempts == 1, 10, what="the RETRY recorded")
    before = suite.browsed_by_name(src)

    progress = move(suite.admin_stub, src, dst, recipient="x@example.net")
    assert progress[-1].done and progress[-1].moved == 3 and progress[-1].resumed == 0
    assert set(suite.browsed_by_name(src)) == {"other"}
    after = suite.browsed_by_name(dst)
    assert set(after) == {"ready", "later", "retried"}
    for name, m in after.items():
        assert m.enqueue_id != before[name].enqueue_id and m.queue == dst
        assert m.enqueued_at == before[name].enqueued_at  # its age
        assert m.deliver_at == before[name].deliver_at and m.attempts == before[name].attempts
    assert after["retried"].attempts == 1 and after["retried"].last_error == "451 4.3.0 try later"
    assert after["later"].deliver_at.ToDatetime() > dt.datetime.utcnow() + dt.timedelta(minutes=50)
    # Delivered from the target with its content; the source hands out only what stayed.
    c = StreamConsumer(suite.dequeue_stub, dst)
    d = c.next()
    assert (d.mail.mail.name, d.content) == ("ready", b"Subject: ready\r\n\r\nbody one")
    c.answer(d)
    with pytest.raises(q.Empty):
        c.next(timeout=2)
    c.close()
    c = StreamConsumer(suite.dequeue_stub, src)
    assert c.next().mail.mail.name == "other"
    c.close()


def test_a_move_journaled_to_another_target_after_the_mail_moved_lands_nothing(suite):
    """Two MoveMails of one mail at once, to B and to C: the one to C journals the mail, read live,
    after the one to B moved it. Completing it (its rerun, or the healer) landed the mail in C too:
    two live copies. It now finds the mail moved elsewhere, and lands nothing."""
    from tests.integration.helpers import enqueue_names, view_rows

    source, b, c = suite.new_queue(), suite.new_queue(), suite.new_queue()
    enqueue_names(suite, source, ["m"])
    [q] = view_rows(suite, source)
    assert move(suite.admin_stub, source, b)[-1].moved == 1
    mover = suite.browse.app.service().admin.mover
    suite.run(suite.view.moves.begin(q, suite.run(mover.landing(q, c))))  # the move to C, killed after its journal entry
    assert move(suite.admin_stub, source, c)[-1].resumed == 1  # its rerun completes it
    names = {queue: [r.mail.mail.name for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))]
             for queue in (source, b, c)}
    assert (names[source], names[b], names[c]) == ([], ["m"], [])
    assert list(suite.run(suite.view.moves.pending(source))) == []


def test_kill_9_of_browse_svc_mid_move_loses_nothing_and_delivers_nothing_twice(suite, keyspace):
    browse_proc = ServiceProcess("browse", service_env(keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target))
    src, dst = suite.new_queue(), suite.new_queue()
    names = [f"m{i}" for i in range(600)]  # 1500 cost 140 s on a loaded machine; a kill lands as well
    for request in (inline(src, simple_mail(n)) for n in names):
        suite.enqueue_stub.Enqueue(request)
    try:
        stub = admin_pb2_grpc.AdminServiceStub(browse_proc.channel())
        stream = stub.MoveMails(admin_pb2.MoveMailsRequest(queue=src, to_queue=dst), timeout=120)
        kill_9_mid_stream(stream, browse_proc, lambda p: p.moved >= 100)
        browse_proc.start()
        stub = admin_pb2_grpc.AdminServiceStub(browse_proc.channel())
        final = move(stub, src, dst)[-1]
    finally:
        browse_proc.stop()
    print(f"\nMoveMails killed after >= 100 moved; the second run moved {final.moved} and completed {final.resumed} "
          f"interrupted move(s)")
    # The moves of the batch under way when killed (those since its last progress message, their
    # MOVED events not recorded yet: services/app/moves.py) are left journaled and resumed.
    assert 0 < final.moved < len(names) and final.resumed <= admin_events.JOURNALED_BATCH
    assert final.moved + final.resumed <= len(names)
    assert final.done
    delivered: collections.Counter[str] = collections.Counter()
    by_queue = collections.defaultdict(set)
    consumers = {queue: StreamConsumer(suite.dequeue_stub, queue, prefetch=64) for queue in (src, dst)}

    def drain() -> bool:
        for queue, c in consumers.items():
            while True:
                try:
                    d = c.next(timeout=0.05)
                except q.Empty:
                    break
                delivered[d.mail.mail.name] += 1
                by_queue[queue].add(d.mail.mail.name)
                c.answer(d)
        return len(delivered) == len(names)

    wait_until(drain, 120, interval=0.01, what="every mail delivered")
    for c in consumers.values():
        c.close()
    twice = [n for n, k in delivered.items() if k > 1]
    print(f"delivered: {len(by_queue[dst])} from the target, {len(by_queue[src])} from the source, {len(twice)} twice")
    assert not twice and not (by_queue[src] & by_queue[dst])
    assert by_queue[dst] == set(names)  # the second run moved the rest


def test_mailq_move_from_another_directory(suite):
    src, dst = suite.new_queue(), suite.new_queue()
    for n in ("a", "b"):
        suite.enqueue_stub.Enqueue(inline(src, simple_mail(n)))
    out = mailq(suite, "move", src, dst, "--name", "a").stdout
    assert f"1 mail(s) moved to {dst}" in out
    assert set(suite.browsed_by_name(dst)) == {"a"} and set(suite.browsed_by_name(src)) == {"b"}


def test_a_move_completed_long_after_it_was_journaled_lands_where_its_target_is_read(suite):
    """A move journaled, then browse_svc down for a day (no healer): the slice chosen at the journal
    is behind the target's browse start when the move completes. Landed there, the mail was in no
    Browse, count or healer pass, and a sweep could take the slice. It lands at browse start."""
    import dataclasses as dc
    import datetime as dt

    from tests.integration.helpers import enqueue_names, view_rows

    source, target = suite.new_queue(), suite.new_queue()
    enqueue_names(suite, source, ["m"])
    [q] = view_rows(suite, source)
    moved = suite.run(suite.browse.app.service().admin.mover.landing(q, target))
    suite.run(suite.view.moves.begin(q, dc.replace(moved, slice_start=moved.slice_start - dt.timedelta(days=1))))
    assert move(suite.admin_stub, source, target, name="nothing-matches")[-1].resumed == 1
    assert [r.mail.mail.name for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=target))] == ["m"]


def test_a_move_cut_between_its_landing_schedule_and_its_publish_is_delivered_once_completed(suite):
    """A retried mail lands with its attempts in a schedule record; a MoveMails killed after that
    record and before the publish left the target copy with no message, and its completion took
    the record for "landed before, something happened to it": the mail was never delivered. The
    record says whether its publish happened: the completion publishes it, once."""
    import dataclasses

    from services.app.moves import MOVED, landed
    from services.domain import model
    from tests.integration.helpers import enqueue_names, view_rows

    source, target = suite.new_queue(), suite.new_queue()
    enqueue_names(suite, source, ["retried"])
    c = StreamConsumer(suite.dequeue_stub, source)
    c.answer(c.next(), "RETRY", "451 later", retry_after=3600)  # attempts 1, delayed an hour
    c.close()
    [row] = view_rows(suite, source)
    q = dataclasses.replace(row, attempts=1, generation=1, last_error="451 later")  # due now, as the row says
    mover = suite.browse.app.service().admin.mover
    landing = suite.run(mover.landing(q, target))
    # The move, killed between the landing's schedule record and its publish
    suite.run(suite.view.moves.begin(q, landing))
    suite.run(suite.view.mails.mark_gone(q, model.truncated(MOVED + target)))
    suite.run(suite.view.mails.store(landed(landing)))
    assert suite.run(suite.view.mails.land(landed(landing))) is None  # landed by the killed call
    assert move(suite.admin_stub, source, target)[-1].resumed == 1
    assert move(suite.admin_stub, source, target)[-1].resumed == 0  # done: its publish recorded
    c = StreamConsumer(suite.dequeue_stub, target, prefetch=4)
    try:
        d = c.next(timeout=30)
        assert (d.mail.mail.name, d.mail.attempts) == ("retried", 1)
        c.answer(d)
        with pytest.raises(q_mod.Empty):
            c.next(timeout=2)  # once
    finally:
        c.close()


def test_moves_completed_again_after_they_landed_are_counted_and_published_once(suite):
    """A MoveMails killed after its moves landed, before their journal entries were removed (a
    batch's events are recorded, then its entries removed), leaves them journaled; the next
    MoveMails completes them. It landed each mail without attempts again: counted twice in the
    target and published twice (two copies of one enqueue id: two dequeue_svc replicas could each
    deliver one). The landing's schedule record now says it landed."""
    from tests.integration.helpers import enqueue_names, message_count, view_rows

    source, target = suite.new_queue(), suite.new_queue()
    names = [f"m{i}" for i in range(5)]
    enqueue_names(suite, source, names)
    rows = view_rows(suite, source)
    assert move(suite.admin_stub, source, target)[-1].moved == 5
    mover = suite.browse.app.service().admin.mover
    for row in rows:  # the journal entries as the killed call left them
        suite.run(suite.view.moves.begin(row, suite.run(mover.landing(row, target))))
    final = move(suite.admin_stub, source, target)[-1]
    assert (final.resumed, final.moved) == (5, 0)
    wait_until(lambda: message_count(target) == 5, 10, what="the target's 5 messages")
    counted = suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=target)).size
    exact = suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=target, exact=True)).size
    assert (counted, exact, message_count(target)) == (5, 5, 5)
    c = StreamConsumer(suite.dequeue_stub, target, prefetch=16)
    try:
        got = sorted(c.next().mail.mail.name for _ in names)
        assert got == names
        with pytest.raises(q_mod.Empty):
            c.next(timeout=2)
    finally:
        c.close()
