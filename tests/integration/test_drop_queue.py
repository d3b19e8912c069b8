"""DeleteQueue (mailq drop) through gRPC and the installed CLI: refused while live mails remain,
forced with them, its RabbitMQ topology gone, its consumers ended, a name that can be used again."""

from __future__ import annotations

import datetime as dt
import queue as queue_mod

import grpc
import pika
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2, events_pb2, events_pb2_grpc
from services.domain import model, names
from stack.harness import broker_parameters, new_keyspace, wait_until
from tests.conftest import Suite
from tests.integration.helpers import StreamConsumer, inline, simple_mail
from tests.integration.test_cli import mailq

#: Each DeleteQueue waits out every replica's queue cache (MAILQUEUE_QUEUE_CACHE_S, 10 s by
#: default): this module's services trust theirs for 1 s.
CACHE = {"MAILQUEUE_QUEUE_CACHE_S": "1"}


@pytest.fixture(scope="module")
def suite(aio_loop, running_stack) -> Suite:
    s = Suite(aio_loop, new_keyspace(), **CACHE)
    yield s
    s.stop(drop=True)


def amqp_exists(amqp_queue: str) -> bool:
    conn = pika.BlockingConnection(broker_parameters())
    try:
        conn.channel().queue_declare(amqp_queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def drop(suite, queue: str, force: bool = False) -> list[admin_pb2.DeleteQueueResponse]:
    return list(suite.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=queue, force=force), timeout=120))


def listed(suite) -> list[str]:
    return list(suite.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues)


@pytest.mark.parametrize("queue,code", [("", "INVALID_ARGUMENT"), ("bad name!", "INVALID_ARGUMENT"), ("x" * 300, "INVALID_ARGUMENT"),
                                        ("no-such-queue-7f3a", "NOT_FOUND")])
def test_bad_input_is_refused_and_deletes_nothing(suite, queue, code):
    before = listed(suite)
    with pytest.raises(grpc.RpcError) as e:
        drop(suite, queue, force=True)
    assert e.value.code().name == code, e.value.details()
    assert listed(suite) == before


def test_a_queue_with_live_mails_is_refused_and_keeps_working(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("kept")))
    with pytest.raises(grpc.RpcError) as e:
        drop(suite, queue)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--force" in e.value.details()
    assert queue in listed(suite) and amqp_exists(names.work_queue(queue))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("after")))
    consumer = StreamConsumer(suite.dequeue_stub, queue)
    got = sorted(consumer.next().mail.mail.name for _ in range(2))
    consumer.close()
    assert got == ["after", "kept"]


def test_a_forced_delete_takes_its_mails_topology_and_consumers_and_the_name_can_be_reused(suite):
    queue = suite.new_queue()
    for i in range(4):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"ready{i}")))
    later = inline(queue, simple_mail("delayed"))
    later.delay.FromTimedelta(dt.timedelta(hours=1))
    suite.enqueue_stub.Enqueue(later)
    idle = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    held = idle.next()  # one delivery left unanswered when the queue goes

    progress = drop(suite, queue, force=True)
    phases = [p.phase for p in progress]
    print(f"\nDeleteQueue --force: phases {phases}, {progress[-1].mails_deleted} live mails deleted")
    assert phases[0] == "stopping" and phases[-1] == "done" and progress[-1].done
    assert progress[-1].mails_deleted == 5  # the one in flight too: its answer will find it gone
    assert queue not in listed(suite)
    for amqp_queue in [names.work_queue(queue, p) for p in ("high", "normal", "low")] + [names.dead_letter_queue(queue)]:
        assert not amqp_exists(amqp_queue), amqp_queue
    # Its consumer's stream ends (UNAVAILABLE: the client reconnects), and a new one is refused.
    wait_until(lambda: idle.call.done(), 30, what="the subscribed stream ended")
    assert idle.call.code() == grpc.StatusCode.UNAVAILABLE, idle.call.details()
    assert held.mail.mail.name.startswith("ready")
    with pytest.raises(grpc.RpcError) as e:
        StreamConsumer(suite.dequeue_stub, queue)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    for call in (lambda: suite.enqueue_stub.Enqueue(inline(queue, simple_mail("late"))),
                 lambda: suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

    # The name again: a new, empty queue (the old mails stay deleted).
    assert suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue)).created
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))) == []
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("new")))
    consumer = StreamConsumer(suite.dequeue_stub, queue)
    assert consumer.next().mail.mail.name == "new"
    consumer.close()
    # The event stream tells it: created, deleted (once it can no longer be refused), its 5 mails
    # deleted with it (reason: the queue was), created again (another incarnation: another id)
    watch = events_pb2_grpc.EventServiceStub(suite.browse.channel()).WatchEvents(events_pb2.WatchEventsRequest(
        queues=[queue], from_oldest=True, types=[events_pb2.EVENT_TYPE_QUEUE_CREATED, events_pb2.EVENT_TYPE_QUEUE_DELETED,
                                                 events_pb2.EVENT_TYPE_DELETED]), timeout=30)
    seen = [next(watch).event for _ in range(8)]
    watch.cancel()
    assert [events_pb2.EventType.Name(e.type)[11:] for e in seen] == ["QUEUE_CREATED", "QUEUE_DELETED"] + [
        "DELETED"] * 5 + ["QUEUE_CREATED"]
    assert len({e.id for e in seen}) == 8 and all(e.reason for e in seen[2:7]) and seen[1].details["force"] == "true"


def test_a_completed_delete_run_again_is_not_found_and_the_name_made_again_deletes_normally(suite):
    """A deletion completed is recorded: DeleteQueue of the name again answers NOT_FOUND (as a name
    never used), lists nothing again and removes nothing; a queue made again under the name is
    deleted as any other, and then NOT_FOUND too."""
    queue = suite.new_queue()
    assert drop(suite, queue)[-1].done
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as e:
            drop(suite, queue, force=True)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "was deleted at" in e.value.details(), e.value.details()
        assert queue not in listed(suite)
    refused = mailq(suite, "drop", queue, "--force", ok=False)
    assert refused.returncode != 0 and "was deleted at" in refused.stderr, refused
    # The name again: a new queue, deleted like any other (its deletion is not the old one's).
    assert suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue)).created
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("m")))
    assert drop(suite, queue, force=True)[-1].mails_deleted == 1
    with pytest.raises(grpc.RpcError) as e:
        drop(suite, queue)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_mailq_drop_from_another_directory(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("m")))
    refused = mailq(suite, "drop", queue, ok=False)
    assert "--force" in refused.stderr
    out = mailq(suite, "drop", queue, "--force").stdout
    assert f"queue {queue} deleted (1 live mail(s)" in out
    assert queue not in mailq(suite, "queues").stdout.split()


def test_dead_letters_refuse_a_plain_delete_and_a_forced_one_purges_them(suite):
    from tests.integration.test_dead_letters import counts, dead, reject_all

    queue = suite.new_queue()
    reject_all(suite, queue, ["dead1", "dead2"])
    with pytest.raises(grpc.RpcError) as e:
        drop(suite, queue)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "dead letters" in e.value.details() and f"mailq dead purge {queue} --all" in e.value.details()
    assert queue in listed(suite) and len(dead(suite, queue)) == 2

    progress = drop(suite, queue, force=True)
    print(f"\nDeleteQueue --force: {progress[-1].mails_deleted} live mails deleted, "
          f"{progress[-1].dead_letters_purged} dead letters purged")
    assert progress[-1].done and progress[-1].mails_deleted == 0 and progress[-1].dead_letters_purged == 2
    # The name made again starts empty: no dead letter of the queue before it is listed or counted.
    assert suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue)).created
    assert dead(suite, queue) == []
    assert counts(suite.browse_stub, queue) == {} and counts(suite.browse_stub, queue, exact=True) == {}
    info = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue)).queue_info
    assert info.dead_lettered == 0


def test_a_forced_delete_killed_mid_way_is_completed_by_running_it_again(suite):
    """browse_svc SIGKILLed at a random instant of a forced DeleteQueue (300 live mails, 100 dead
    letters); run again, the delete completes: the name made again is an empty queue."""
    from mailqueue.v1 import admin_pb2_grpc
    from stack.harness import ServiceProcess, service_env
    from tests.integration.helpers import kill_9_mid_stream
    from tests.integration.test_dead_letters import counts, dead, reject_all

    queue = suite.new_queue()
    reject_all(suite, queue, [f"dead{i}" for i in range(100)])
    many = enqueue_many(suite, queue, 300)
    proc = ServiceProcess("browse", service_env(suite.keyspace, MAILQUEUE_BLOB_TARGET=suite.blob.target, **CACHE))
    try:
        stream = admin_pb2_grpc.AdminServiceStub(proc.channel()).DeleteQueue(
            admin_pb2.DeleteQueueRequest(queue=queue, force=True), timeout=120)
        kill_9_mid_stream(stream, proc, lambda p: p.phase == "deleting")
        assert queue not in listed(suite)  # taken off the list first, killed or not
        proc.start()
        final = list(admin_pb2_grpc.AdminServiceStub(proc.channel()).DeleteQueue(
            admin_pb2.DeleteQueueRequest(queue=queue, force=True), timeout=120))[-1]
    finally:
        proc.stop()
    print(f"\nforced DeleteQueue killed mid-way; run again: {final.mails_deleted} mails deleted, "
          f"{final.dead_letters_purged} dead letters purged by the second run")
    assert final.done and final.mails_deleted <= many and final.dead_letters_purged <= 100
    assert not amqp_exists(names.work_queue(queue))
    assert suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue)).created
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue))) == []
    assert dead(suite, queue) == [] and counts(suite.browse_stub, queue, exact=True) == {}
    exact = suite.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue, exact=True)).queue_info
    assert exact.size == 0 and exact.dead_lettered == 0


def enqueue_many(suite, queue: str, n: int) -> int:
    from mailqueue.v1 import enqueue_pb2

    def requests():
        for i in range(n):
            yield enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"live{i}")))

    return sum(r.WhichOneof("result") == "receipt" for r in suite.enqueue_stub.EnqueueMany(requests(), timeout=120))


def cut_move(suite, source: str, target: str):
    """A mail "m" of ``source`` as a MoveMails to ``target`` killed between its steps 2 and 3 leaves
    it: journaled, marked moved, not landed. Returns its view row."""
    from tests.integration.helpers import enqueue_names, view_rows

    enqueue_names(suite, source, ["m"])
    [q] = view_rows(suite, source)
    moved = suite.run(suite.browse.app.service().admin.mover.landing(q, target))
    suite.run(suite.view.moves.begin(q, moved))
    suite.run(suite.view.mails.mark(source, q.enqueue_id, "moved to " + target))
    return q


def test_a_move_interrupted_out_of_the_queue_is_completed_before_it_is_deleted(suite):
    """MoveMails killed between marking a mail moved and landing it in its target: the mail is live
    nowhere, and only the source's journal lands it. DeleteQueue of the source (nothing live in it)
    dropped that journal's chance: the mail was lost for good. It completes the move first."""
    source, target = suite.new_queue(), suite.new_queue()
    cut_move(suite, source, target)
    assert drop(suite, source)[-1].done
    assert [r.mail.mail.name for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=target))] == ["m"]


def test_a_queue_created_again_during_its_deletion_is_kept_whole(suite):
    """CreateQueue of the name while DeleteQueue waits out the caches: the new queue answered
    created, then the deletion removed its RabbitMQ topology and its retry policy (a queue listed
    but unusable). The deletion now ends ABORTED and removes nothing of the new queue."""
    queue = suite.new_queue()
    stream = suite.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=queue), timeout=60)
    assert next(stream).phase == "stopping"  # unlisted; waiting for every replica's cache
    assert suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue)).created
    with pytest.raises(grpc.RpcError) as e:
        list(stream)
    assert e.value.code() == grpc.StatusCode.ABORTED and "created again" in e.value.details()
    assert queue in suite.browse_stub.ListQueues(browse_pb2.ListQueuesRequest()).queues
    assert amqp_exists(names.work_queue(queue))
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("after")))
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    assert c.next().mail.mail.name == "after"
    c.close()


def test_a_move_cut_before_landing_into_a_queue_deleted_since_puts_the_mail_back_in_its_source(suite):
    """MoveMails killed between marking a mail moved and landing it; its target, empty, is then
    deleted (nothing live in it: allowed). Completing the move landed the mail in the deleted queue,
    which nobody consumes: lost. It now goes back to its source, live and delivered once."""
    from tests.integration.test_move_mails import move

    source, target, other = suite.new_queue(), suite.new_queue(), suite.new_queue()
    q = cut_move(suite, source, target)
    assert drop(suite, target)[-1].done
    assert move(suite.admin_stub, source, other, name="nothing-matches")[-1].resumed == 1  # completes the journal
    assert [r.mail.mail.name for r in suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=source))] == ["m"]
    c = StreamConsumer(suite.dequeue_stub, source, prefetch=4)
    d = c.next()
    assert (d.mail.enqueue_id, d.content) == (str(q.enqueue_id), b"Subject: x\r\n\r\nbody")
    c.answer(d)
    with pytest.raises(queue_mod.Empty):  # once: the old message, still queued, is superseded
        c.next(timeout=3)
    c.close()


@pytest.mark.parametrize("cut", ["after its schedule", "after its unmark"])
def test_a_mail_put_back_in_its_source_by_a_completion_cut_before_its_publish_is_delivered(suite, cut):
    """The completion that puts the mail back (previous test) killed before its publish: after
    it wrote the mail's new schedule (the mail still marked moved), or after it unmarked it too
    (live one generation up: the old message is superseded). The next completion used to find the
    latter live and leave it so, with no message until the healer's round. It now puts the mail
    back again, or publishes it, and the mail is delivered once."""
    import dataclasses

    from tests.integration.test_move_mails import move

    source, target, other = suite.new_queue(), suite.new_queue(), suite.new_queue()
    q = cut_move(suite, source, target)
    assert drop(suite, target)[-1].done
    again = dataclasses.replace(q, generation=q.generation + 1)
    suite.run(suite.view.mails.reschedule(again, unpublished=True))  # the cut completion's steps
    if cut == "after its unmark":
        suite.run(suite.view.mails.unmark(source, q.enqueue_id, model.utcnow()))
    assert move(suite.admin_stub, source, other, name="nothing-matches")[-1].resumed == 1
    c = StreamConsumer(suite.dequeue_stub, source, prefetch=4)
    d = c.next(timeout=30)
    assert (d.mail.enqueue_id, d.mail.mail.name) == (str(q.enqueue_id), "m")
    c.answer(d)
    with pytest.raises(queue_mod.Empty):  # once: the old message is superseded
        c.next(timeout=3)
    c.close()
    assert list(suite.run(suite.view.moves.pending(source))) == []
    state = suite.run(suite.view.mails.state(source, q.enqueue_id))
    assert state is not None and not state.unpublished  # its publish recorded


def test_a_move_cut_after_landing_whose_copy_was_delivered_is_not_put_back_when_its_target_is_deleted(suite):
    """MoveMails killed after landing the mail and before removing its journal entry; the landed
    copy is delivered (SUCCESS), and its target, empty, is deleted. Completing the journal took the
    deleted target for a move never landed and put the mail back in its source: delivered again
    under its first enqueue id, which its consumer never saw. It now finishes the entry only."""
    from services.app.moves import land
    from tests.integration.test_move_mails import move

    source, target, other = suite.new_queue(), suite.new_queue(), suite.new_queue()
    q = cut_move(suite, source, target)
    mover = suite.browse.app.service().admin.mover
    moved = suite.run(mover.landing(q, target))
    suite.run(land(suite.view, mover._broker, suite.run(mover.placed(moved))))  # noqa: SLF001 - killed after this
    c = StreamConsumer(suite.dequeue_stub, target, prefetch=4)
    d = c.next(timeout=10)
    assert d.mail.enqueue_id == str(moved.enqueue_id)
    c.answer(d)  # SUCCESS: delivered from the target
    c.close()
    wait_until(lambda: suite.size(target) == 0, 10, what="the landed copy delivered")
    assert drop(suite, target)[-1].done
    assert move(suite.admin_stub, source, other, name="nothing-matches")[-1].resumed == 1  # completes the journal
    assert list(suite.run(suite.view.moves.pending(source))) == []
    assert suite.size(source, exact=True) == 0  # (cut_move's mark is not counted: the counters are not the point)
    assert list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=source))) == []
    c = StreamConsumer(suite.dequeue_stub, source, prefetch=4)
    with pytest.raises(queue_mod.Empty):  # never delivered again
        c.next(timeout=3)
    c.close()


def test_a_redrive_cut_before_landing_into_a_queue_deleted_since_is_a_dead_letter_again(suite):
    """A redrive killed after removing the dead letter and before landing it; its target is then
    deleted. Completing it landed the mail in the deleted queue: in no queue and in no dead-letter
    list. It is now a dead letter again, listed, and a redrive elsewhere delivers it."""
    import dataclasses as dc

    from services.app.dead_letter_admin import journal
    from services.domain import dead_letters
    from tests.integration.test_dead_letters import dead, redrive, reject_all

    queue, target, elsewhere = suite.new_queue(), suite.new_queue(), suite.new_queue()
    reject_all(suite, queue, ["r"])

    async def scanned() -> list:
        return [d async for d in suite.view.dead_letters.scan(queue)]

    [d] = suite.run(scanned())
    landed = suite.run(suite.browse.app.service().dead_letters._landing(d, target, False))
    suite.run(suite.view.moves.begin(dc.replace(d.mail, queue=journal(queue)), landed))
    suite.run(suite.view.mails.mark(queue, d.mail.enqueue_id, dead_letters.redriven_reason(target, str(landed.enqueue_id))))
    suite.run(suite.view.dead_letters.remove(d.mail))  # killed before landing it
    assert drop(suite, target)[-1].done
    assert redrive(suite.admin_stub, queue, to_queue=elsewhere)[-1].redriven == 1  # the journal, then the dead letter again
    c = StreamConsumer(suite.dequeue_stub, elsewhere, prefetch=4)
    assert c.next().mail.mail.name == "r"
    c.close()
    assert dead(suite, queue) == []


def test_a_redrive_cut_after_landing_whose_copy_was_delivered_is_no_dead_letter_again_when_its_target_is_deleted(suite):
    """The redrive twin of the move above: its landed copy delivered, its target deleted, the
    completion listed the mail as a dead letter again ("redrive it again"): redriven, delivered a
    second time."""
    import dataclasses as dc

    from services.app.dead_letter_admin import journal
    from services.app.moves import land
    from services.domain import dead_letters
    from tests.integration.test_dead_letters import dead, redrive, reject_all

    queue, target, elsewhere = suite.new_queue(), suite.new_queue(), suite.new_queue()
    reject_all(suite, queue, ["r"])

    async def scanned() -> list:
        return [d async for d in suite.view.dead_letters.scan(queue)]

    [d] = suite.run(scanned())
    service = suite.browse.app.service()
    landed = suite.run(service.dead_letters._landing(d, target, False))  # noqa: SLF001
    suite.run(suite.view.moves.begin(dc.replace(d.mail, queue=journal(queue)), landed))
    suite.run(suite.view.mails.mark(queue, d.mail.enqueue_id, dead_letters.redriven_reason(target, str(landed.enqueue_id))))
    suite.run(suite.view.dead_letters.remove(d.mail))
    mover = service.admin.mover
    suite.run(land(suite.view, mover._broker, suite.run(mover.placed(landed))))  # noqa: SLF001 - killed after this
    c = StreamConsumer(suite.dequeue_stub, target, prefetch=4)
    c.answer(c.next(timeout=10))  # SUCCESS: delivered from the target
    c.close()
    wait_until(lambda: suite.size(target) == 0, 10, what="the landed copy delivered")
    assert drop(suite, target)[-1].done
    assert redrive(suite.admin_stub, queue, to_queue=elsewhere)[-1].redriven == 0  # the journal finished, nothing to redrive
    assert dead(suite, queue) == []
    assert list(suite.run(suite.view.moves.pending(journal(queue)))) == []
