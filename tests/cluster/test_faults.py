"""Node faults under load on the 3-node clusters (DESIGN §9).

Each test runs producers and consumers continuously (tests/cluster/load.py), injects one fault
with stack/stack.sh node ..., waits for the cluster to heal, then checks the invariants:
0 acked mails lost, 0 deliveries after a SUCCESS the server confirmed, every RPC OK or UNAVAILABLE,
no row left without a delivered message, and the four services SERVING again without a restart.
The recovery figures are printed and appended to .stack/cluster-faults.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import grpc
import pytest
from google.protobuf import duration_pb2

from mailqueue.v1 import admin_pb2, browse_pb2, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2
from services.domain import names
from stack.harness import ROOT, stack, wait_until
from tests.integration.helpers import StreamConsumer
from tests.load import Load

#: Mails acknowledged before a fault, so that it hits traffic in flight.
WARM_UP_MAILS = 150
#: Mails per second per producer (three producers): traffic in flight through every fault, at half
#: the load generator's default, so that on 2 cores the nodes' recovery (commit-log replay, hinted
#: handoff, quorum catch-up) is not starved by the load it is measured under.
RATE_PER_PRODUCER = 20.0
REPORT = os.path.join(ROOT, ".stack", "cluster-faults.jsonl")


def node(action: str, name: str) -> None:
    stack("node", action, name, timeout=480)


def list_queues(*columns: str) -> list[dict]:
    """rabbitmqctl list_queues, asked of the first node whose broker runs."""
    for i in ("1", "2", "3"):
        p = stack("rabbitmqctl", "--node", i, "-q", "-t", "20", "list_queues", "name", *columns, "--formatter", "json",
                  check=False)
        if p.returncode == 0:
            return json.loads(p.stdout)
    raise AssertionError(f"no RabbitMQ node answered list_queues: {p.stderr[-500:]}")


def work_queue_leader(queue: str) -> str:
    """The RabbitMQ node (rabbitmq1-3) that leads the queue's work queue."""
    for q in list_queues("leader"):
        if q["name"] == names.work_queue(queue):
            return "rabbitmq" + q["leader"].split("@")[0].removeprefix("mq")
    raise AssertionError(f"no work queue for {queue}")


def members(queue: str) -> int:
    return next(len(q["members"]) for q in list_queues("members") if q["name"] == names.work_queue(queue))


def start_load(services, queue: str) -> Load:
    load = Load(services.enqueue.target, services.dequeue.target, queue, rate_per_producer=RATE_PER_PRODUCER).start()
    # 120 s: right after a node fault of the test before, on a loaded 2-core machine (load average
    # 16), the warm-up took more than 60 s twice (2026-12-06); alone, the same tests passed.
    wait_until(lambda: load.confirmed and len(load.acked) >= WARM_UP_MAILS, 120, interval=0.1,
               what=f"{WARM_UP_MAILS} mails acknowledged and the first deliveries confirmed")
    return load


def finish(services, load: Load, name: str, fault_at: float, healed_at: float, **extra) -> dict:
    """Heal, drain and check every invariant; print and record the figures."""
    serving_s = services.wait_serving()
    figures = {
        "fault": name,
        "first_ok_enqueue_after_fault_s": _round(load.first_ok("enqueue", fault_at)),
        "first_delivery_after_fault_s": _round(load.first_delivery(fault_at)),
        "longest_enqueue_gap_s": _round(load.longest_gap("enqueue", fault_at, healed_at)),
        "longest_delivery_gap_s": _round(_delivery_gap(load, fault_at, healed_at)),
        "services_serving_after_heal_s": _round(serving_s),
        **extra,
    }
    wait_until(lambda: load.first_ok("enqueue", healed_at) is not None, 60, interval=0.2, what="an enqueue after the heal")
    figures["first_ok_enqueue_after_heal_s"] = _round(load.first_ok("enqueue", healed_at))
    # The long-lived stream (or the one that replaced it) receives again.
    wait_until(lambda: any(t > healed_at for t in load.long_deliveries), 60, interval=0.2,
               what="a delivery on the long-lived consumer after the heal")
    figures["long_consumer_first_delivery_after_heal_s"] = _round(min(t for t in load.long_deliveries if t > healed_at) - healed_at)
    load.stop_producing()
    # Drained: every acked mail delivered, and no live row left (each delivered mail's SUCCESS
    # settled, each failed enqueue undone), while the consumers keep running.
    missing = load.wait_delivered(90)
    if missing:
        # RabbitMQ 3.10.8 can keep messages checked out to consumers whose node was cut off and
        # came back (a hung node's channels; seen after SIGSTOP): their rows are live, so the
        # repair for a broker that lost messages brings them back, as an operator would run it.
        figures["stuck_in_broker"] = len(missing)
        figures["broker"] = _queue_counts(load.queue)
        figures["republished"] = services.admin.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
            queue=load.queue, older_than=duration_pb2.Duration(seconds=30)), timeout=120).republished
        missing = load.wait_delivered(120)
    rows_left = None
    if not missing:
        try:
            _no_live_rows(services, load, load.queue)
        except AssertionError as e:
            # A mail delivered once whose SUCCESS was refused while the node hung (not confirmed to
            # the consumer, nothing changed) is owed a redelivery; the broker may keep its message
            # checked out to a channel of the hung node as above (seen once in a clean-clone run:
            # one live row, delivered once, never again in 90 s). The same repair, then check again.
            figures["unsettled_stuck_in_broker"] = str(e)[:300]
            figures["republished_unsettled"] = services.admin.RepublishNotProcessed(admin_pb2.RepublishNotProcessedRequest(
                queue=load.queue, older_than=duration_pb2.Duration(seconds=30)), timeout=120).republished
            try:
                _no_live_rows(services, load, load.queue)
            except AssertionError as again:
                rows_left = again
    load.stop()
    figures.update(first_delivery_after_heal_s=_round(load.first_delivery(healed_at)), acked=len(load.acked),
                   lost=len(missing), confirmed=len(load.confirmed), codes=dict(load.codes(fault_at)))
    figures["errors"] = load.error_details()
    # Deliveries of an enqueue the client saw fail (its undo not yet written when it was
    # delivered): at-least-once duplicates of a mail the client enqueued again. Reported.
    with load.lock:
        acked_ids = set(load.acked.values())
        figures["delivered_not_acked"] = sum(1 for i in load.deliveries if i not in acked_ids)
    if missing:  # what the broker and dequeue_svc say of them
        figures["broker_after"] = _queue_counts(load.queue)
        figures["skipped"] = {r: services.dequeue.metric("mailqueue_skipped_total", queue=load.queue, reason=r)
                              for r in ("deleted", "in-flight", "superseded", "swept", "early", "undecodable")}
    print(f"\n[cluster] {json.dumps(figures)}")
    with open(REPORT, "a", encoding="utf-8") as f:
        f.write(json.dumps(figures) + "\n")
    assert not missing, f"{len(missing)} acked mails never delivered, e.g. {missing[:5]}"
    assert rows_left is None, rows_left
    assert not load.delivered_after_confirmed_success(), "a mail was delivered after its SUCCESS was confirmed"
    bad = load.bad_calls()
    assert not bad, f"{len(bad)} calls ended with neither OK nor UNAVAILABLE: {bad[:5]}"
    return figures


def _queue_counts(queue: str) -> dict:
    rows = list_queues("messages_ready", "messages_unacknowledged", "consumers", "leader")
    return next((q for q in rows if q["name"] == names.work_queue(queue)), {})


def _delivery_gap(load: Load, since: float, until: float) -> float:
    with load.lock:  # the consumers go on appending
        times = sorted(t for ts in load.deliveries.values() for t in ts if since <= t <= until)
    marks = [since, *times, until]
    return max(b - a for a, b in zip(marks, marks[1:]))


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _no_live_rows(services, load: Load, queue: str) -> None:
    """Every row has its mail delivered and marked, or its failed enqueue undone: no row without a
    delivered message (the queue is drained, so the exact size must reach 0)."""
    browse = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(services.browse.target))

    def size() -> int:
        try:
            return browse.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=True), timeout=30).size
        except grpc.RpcError:
            return -1

    try:
        wait_until(lambda: size() == 0, 90, interval=0.5, what=f"no live row left in {queue}")
    except AssertionError:
        left = list(browse.Browse(browse_pb2.BrowseRequest(queue=queue, limit=20), timeout=30))
        with load.lock:
            facts = [(r.mail.mail.name, r.mail.enqueue_id, load.acked.get(r.mail.mail.name),
                      len(load.deliveries.get(r.mail.enqueue_id, [])), r.mail.enqueue_id in load.confirmed) for r in left]
        raise AssertionError(f"live rows left (name, id, acked, deliveries, confirmed): {facts}") from None


def test_quorum_queues_have_three_members(services):
    queue = services.new_queue()
    assert members(queue) == 3


@pytest.mark.timeout(600)
def test_rabbitmq_leader_killed_and_restarted(services):
    queue = services.new_queue()
    load = start_load(services, queue)
    leader = work_queue_leader(queue)
    fault_at = time.monotonic()
    node("kill", leader)
    load.run_through_fault(fault_at, 10)  # 10 s of traffic without the node
    node("start", leader)
    healed_at = time.monotonic()
    finish(services, load, f"SIGKILL {leader} (work queue leader), restart", fault_at, healed_at,
           restart_s=round(healed_at - fault_at - 10, 1))
    assert members(queue) == 3


@pytest.mark.timeout(900)
def test_cassandra_nodes_killed_one_then_two_then_restarted(services):
    """One node killed: the queue goes on (QUORUM of three). A second one killed, quorum lost:
    enqueues answer UNAVAILABLE quickly and write nothing that survives. Both restarted (their
    commit logs replayed): the queue recovers by itself once one is back. One test for both
    faults, as each restart of a node costs a minute or more on the 2-core machine."""
    queue = services.new_queue()
    load = start_load(services, queue)
    fault_at = time.monotonic()
    node("kill", "cassandra3")
    load.run_through_fault(fault_at, 10)  # 10 s of traffic with one node dead
    one_down = load.codes(fault_at + 2, time.monotonic())  # past the calls the kill cut
    assert one_down["enqueue:OK"] > 0 and not one_down["enqueue:UNAVAILABLE"], \
        f"with one node of three dead, enqueues go on: {dict(one_down)}"
    quorum_lost_at = time.monotonic()
    node("kill", "cassandra2")
    # Once the survivor's gossip knows (a few seconds), writes are refused before they start.
    stub = enqueue_pb2_grpc.EnqueueServiceStub(grpc.insecure_channel(services.enqueue.target))
    latencies = []

    def refused_quickly() -> bool:
        request = enqueue_pb2.EnqueueRequest(queue=queue, mail=mail_pb2.Mail(name="probe", recipients=["x@example.org"]),
                                             inline_content=b"probe")
        t = time.monotonic()
        try:
            stub.Enqueue(request, timeout=30)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        latencies.append((round(time.monotonic() - quorum_lost_at, 2), code.name, round(time.monotonic() - t, 3)))
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE), code
        return code == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t < 0.5

    wait_until(refused_quickly, 60, interval=0.2, what="enqueue refused at once with UNAVAILABLE")
    detected_s = time.monotonic() - quorum_lost_at
    refusals = []
    for _ in range(10):  # from then on, every write is refused at once
        refused_quickly()
        refusals.append(latencies[-1])
    assert all(code == "UNAVAILABLE" for _, code, _ in refusals), refusals
    assert max(lat for _, _, lat in refusals) < 0.5, refusals
    load.run_through_fault(time.monotonic(), 10)  # 10 s more of traffic without a quorum
    started = time.monotonic()
    node("start", "cassandra2")
    healed_at = time.monotonic()
    first_ok = wait_until(lambda: load.first_ok("enqueue", healed_at), 120, interval=0.2, what="an enqueue OK again")
    # The third node starts while the queue drains and every invariant is checked (a node that
    # rejoins meanwhile is part of the fault); it is up again before the test ends.
    third = subprocess.Popen([os.path.join(ROOT, "stack", "stack.sh"), "node", "start", "cassandra3"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        finish(services, load, "SIGKILL cassandra3, then cassandra2 (quorum lost), restart both", fault_at, healed_at,
               one_down_codes=dict(one_down), refused_at_once_after_s=round(detected_s, 2),
               refusal_latency_max_s=max(lat for _, _, lat in refusals), restart_s=round(healed_at - started, 1),
               first_ok_enqueue_after_quorum_back_s=round(first_ok, 2))
    finally:
        try:
            out, _ = third.communicate(timeout=480)
        except subprocess.TimeoutExpired:
            third.kill()
            out, _ = third.communicate()
            raise
    assert third.returncode == 0, f"stack.sh node start cassandra3 failed:\n{out[-3000:]}"
    # All three nodes back: the services serve, and a mail goes in and out.
    services.wait_serving()
    after = services.new_queue()

    def enqueued_after() -> bool:
        try:
            stub.Enqueue(enqueue_pb2.EnqueueRequest(queue=after, mail=mail_pb2.Mail(name="after", recipients=["x@example.org"]),
                                                    inline_content=b"after"), timeout=30)
            return True
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            return False

    wait_until(enqueued_after, 60, interval=0.5, what="an enqueue with the three nodes back")
    consumer = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(grpc.insecure_channel(services.dequeue.target)), after)
    try:
        delivered = consumer.next(timeout=60)
        consumer.answer(delivered)
    finally:
        consumer.close()
    assert delivered.mail.mail.name == "after"


# Last: after a RabbitMQ leader hung for 30 s and resumed (RabbitMQ 3.10.8), publishes to a queue
# declared next went unconfirmed for minutes (two CI runs of 2026-12-06: the next test's set-up
# timed out); the hung test checks its own load's recovery.
@pytest.mark.parametrize("name", ["cassandra3", "rabbitmq-leader"])
@pytest.mark.timeout(600)
def test_node_hung_for_30s(services, name):
    queue = services.new_queue()
    load = start_load(services, queue)
    if name == "rabbitmq-leader":
        name = work_queue_leader(queue)
    fault_at = time.monotonic()
    node("stop", name)
    try:
        load.run_through_fault(fault_at, 30)  # SIGSTOP for 30 s of traffic: the hung node the issue asks for
    finally:
        node("cont", name)
    healed_at = time.monotonic()
    finish(services, load, f"SIGSTOP {name} 30 s, SIGCONT", fault_at, healed_at)
