"""#36: every mail an adversarial client had acknowledged is delivered, or dead for a reason that
client caused, within a deadline far below the healer's grace (900 s by default): an acknowledged
mail never waits for the healer. #47: no mail is handed out after a SUCCESS the server confirmed
(a stream that ended OK, or an answer read before an invalid one), and once the streams ended
GetSize is what can be drained (within the counters' documented lag). And the first
view-configuration change obeys the rules."""

import uuid

import grpc
import pytest
from google.protobuf import duration_pb2

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2
from stack.harness import ServiceProcess, new_keyspace, service_env, stack
from tests.adversary import play
from tests.conftest import drop_keyspace
from tests.integration.helpers import deleted_reason

#: Far below the healer's grace: what is not delivered by then waits for a broker message that is gone.
DEADLINE_S = 60.0
#: The play goes on past its 4 s until this many mails were acknowledged (a loaded machine acked 25-48 in 4 s).
MIN_ACKED = 50
#: The suite plays 10 seeds (about 10 s each); `python -m tests.adversary --seeds 0-19` plays more.
SEEDS = range(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_an_adversarial_client_strands_no_acknowledged_mail(process_suite, seed):
    s = process_suite
    queue = s.new_queue(max_attempts=3)
    played = play(s.enqueue_stub, s.dequeue_stub, s.browse_stub, queue, seed,
                  lambda eid: deleted_reason(s, queue, uuid.UUID(eid)) is not None, deadline_s=DEADLINE_S, min_acked=MIN_ACKED)
    record, size = played.record, played.size
    assert record.wrong == []
    assert len(record.acked) >= MIN_ACKED, record.calls  # the traffic happened
    assert played.stranded == [], (
        f"seed {seed}: {len(played.stranded)} of {len(record.acked)} acknowledged mails stranded:\n"
        + "\n".join(f"  {eid}: {s.run(s.view.mails.state(queue, uuid.UUID(eid)))}" for eid in played.stranded[:10])
        + f"\nthe queue's RabbitMQ queues (ready, unacked, consumers):\n{broker_queues(queue)}"
    )

    # Each ended for a reason this client caused: delivered, rejected by it, expired by its RETRYs,
    # or handed out unanswered until the broker's delivery limit.
    for eid in record.acked:
        reason = deleted_reason(s, queue, uuid.UUID(eid))
        if reason == "dequeued":
            continue
        if eid in record.rejected and reason.startswith("dead-lettered"):
            continue
        if eid in record.unanswered and "delivery limit" in reason:
            continue
        assert eid in record.retried and "attempt" in reason, f"seed {seed}: {eid} ended with {reason!r}"

    # #47: no mail handed out after a confirmed SUCCESS of it (the check had some to check), and
    # once the streams ended GetSize said, within the counters' lag, what could be drained.
    assert record.confirmed, record.calls
    assert played.again == [], (f"seed {seed}: {len(played.again)} deliveries after a confirmed SUCCESS:\n"
                                + "\n".join(map(str, played.again[:10])))
    assert size.counted == size.exact == len(played.drained), f"seed {seed}: {size}, drained {len(played.drained)}"
    print(f"seed {seed}: {played}; moves {dict(record.calls)}")


def broker_queues(queue: str) -> str:
    listed = stack("rabbitmqctl", "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers",
                   check=False).stdout
    return "\n".join(line for line in listed.splitlines() if queue in line)


def test_the_first_configuration_change_of_a_fresh_keyspace_obeys_the_rules(running_stack):
    """On a keyspace where no configuration was ever stored, the defaults are in force: a slice
    window that does not divide 3600 s is refused, one that does is taken (through gRPC)."""
    keyspace = new_keyspace()
    browse = ServiceProcess("browse", service_env(keyspace))
    try:
        admin = admin_pb2_grpc.AdminServiceStub(browse.channel())

        def update(window_s: int, buckets: int = 1):
            return admin.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=browse_pb2.ViewConfiguration(
                slice_window=duration_pb2.Duration(seconds=window_s), bucket_count=buckets, update_browse_start_pace=1000)))

        before = admin.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
        assert before.slice_window.seconds == 3600 and before.bucket_count == 1
        for window in (1500, 7200):
            with pytest.raises(grpc.RpcError) as e:
                update(window)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
            assert "divisor" in e.value.details()
        assert admin.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration == before  # nothing written
        assert update(1800, 2).configuration.slice_window.seconds == 1800
        with pytest.raises(grpc.RpcError) as e:
            update(3600, 2)  # 1800 s is in force now: no way back up
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        browse.stop()
        drop_keyspace(keyspace)
