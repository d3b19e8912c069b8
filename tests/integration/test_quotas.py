"""Enqueue quotas and depth limits (issue #50), through gRPC on the real stack.

Two enqueue replicas of a keyspace of their own (so no other test's replica is a member sharing
the rates), with access control: one token names the tenant ``acme`` (``producer@acme:...``).
The suite's own enqueue_svc is stopped (it would be a third member). Browse, admin, blob and
dequeue are the suite's."""

from __future__ import annotations

import hashlib
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from mailqueue.v1 import admin_pb2, blob_pb2, enqueue_pb2, enqueue_pb2_grpc, quotas_pb2
from stack.harness import ServiceProcess, new_keyspace, wait_until
from tests.conftest import ProcessSuite, drop_keyspace
from tests.integration.helpers import StreamConsumer, inline, message_count, simple_mail

ACME = "acmeacmeacmeacme0001"
OTHER = "otherotherother00002"
AUTH = (("authorization", f"Bearer {ACME}"),)
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
#: The bound the docs state: a change is enforced by every replica within REFRESH_S plus one read
#: (1.0-1.1 s measured on an idle machine; 3 s allows for a store read slowed by a loaded machine).
PROPAGATION_S = 3.0


@pytest.fixture(scope="module")
def quota_suite(aio_loop, running_stack):
    keyspace = new_keyspace()
    s = ProcessSuite(aio_loop, keyspace)
    s.enqueue.stop()
    env = {k: v for k, v in s.enqueue.env.items() if k not in ("MAILQUEUE_PORT", "MAILQUEUE_METRICS_PORT")}
    env["MAILQUEUE_TOKENS"] = f"producer@acme:{ACME},producer:{OTHER}"
    s.replicas = [ServiceProcess("enqueue", env, metrics=True) for _ in range(2)]
    s.stubs = [enqueue_pb2_grpc.EnqueueServiceStub(r.channel()) for r in s.replicas]
    # The stopped replica's heartbeat expires (MEMBER_TTL_S): each live one sees two members.
    wait_until(lambda: all(r.metric("mailqueue_quota_members") == 2 for r in s.replicas), timeout=15, what="two members")
    yield s
    for r in s.replicas:
        r.stop()
    s.stop()
    drop_keyspace(keyspace)


def set_quota(s, **fields) -> quotas_pb2.Quota:
    return s.admin_stub.SetQuota(admin_pb2.SetQuotaRequest(quota=quotas_pb2.Quota(**fields))).quota


def clear_quota(s, kind_name: str, subject: str) -> bool:
    return s.admin_stub.ClearQuota(admin_pb2.ClearQuotaRequest(kind=kind(kind_name), subject=subject)).cleared


def kind(name: str) -> int:
    return getattr(quotas_pb2, f"QUOTA_KIND_{name.upper()}")


def enqueue(stub, request) -> grpc.RpcError | None:
    """None when accepted, else the error (a grpc.Call as well)."""
    try:
        stub.Enqueue(request, metadata=AUTH, timeout=10)
        return None
    except grpc.RpcError as e:
        return e


def details(call) -> tuple[error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure]:
    status = rpc_status.from_call(call)
    assert status is not None, "no google.rpc.Status in the trailers"
    retry, failure = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
    assert [d.Unpack(retry) or d.Unpack(failure) for d in status.details] == [True, True]
    return retry, failure


def test_two_replicas_share_a_tenant_rate(quota_suite):
    # Given the tenant acme limited to 20 mails/s with a burst of 10, across both replicas
    s = quota_suite
    queue = s.new_queue()
    set_quota(s, kind=kind("tenant"), subject="acme", mails_per_s=20, burst_mails=10)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="tenant", subject="acme") == 20 for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="the quota on both replicas")
    # When each replica is offered as many mails as one client can send, for 10 s
    window, accepted, refused, lock = 10.0, [0], [], threading.Lock()
    start = time.monotonic()

    def offer(stub) -> None:
        i = 0
        while time.monotonic() < start + window:
            i += 1
            e = enqueue(stub, inline(queue, simple_mail(f"r{i}")))
            with lock:
                if e is None:
                    accepted[0] += 1
                else:
                    refused.append(e)

    threads = [threading.Thread(target=offer, args=(stub,)) for stub in s.stubs]
    threads += [threading.Thread(target=offer, args=(stub,)) for stub in s.stubs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then the total accepted stays within limit x time + burst (+5 %), and some were refused. The
    # lower bound says both replicas took their share (one alone accepts at most 10 x 10 + 5); not
    # 0.95: on a loaded 2-core machine a client idle for more than its half-burst's 0.5 s loses
    # slots (measured 204, 181, 166 of 210 at load averages of 3 to 10)
    print(f"accepted {accepted[0]} in {window} s, refused {len(refused)}")
    assert 0.7 * 20 * window <= accepted[0] <= 1.05 * (20 * window + 10)
    assert refused and all(e.code() == EXHAUSTED for e in refused)
    # And each refusal tells how long to wait and which quota, decoded by the stock library
    retry, failure = details(refused[-1])
    assert 0 < retry.retry_delay.ToTimedelta().total_seconds() <= 1.0
    assert failure.violations[0].subject == "tenant:acme"
    assert "mails_per_s" in failure.violations[0].description
    assert clear_quota(s, "tenant", "acme")


def test_a_change_reaches_every_replica_within_the_bound(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    sender = f"x{time.monotonic_ns()}@sender.test"

    def refused_on(stub) -> bool:  # a second mail at once is refused once the 1/s quota is in force
        return any(enqueue(stub, inline(queue, simple_mail("c", sender=sender))) is not None for _ in range(2))

    # When a quota is set, every replica refuses within the bound
    began = time.monotonic()
    set_quota(s, kind=kind("sender"), subject=sender, mails_per_s=0.2, burst_mails=1)
    for stub in s.stubs:
        wait_until(lambda stub=stub: refused_on(stub), timeout=PROPAGATION_S, interval=0.05, what="the quota in force")
    took_set = time.monotonic() - began
    # And when it is cleared, every replica accepts again within the bound
    began = time.monotonic()
    assert clear_quota(s, "sender", sender)
    for stub in s.stubs:
        wait_until(lambda stub=stub: enqueue(stub, inline(queue, simple_mail("c", sender=sender))) is None,
                   timeout=PROPAGATION_S, what="the quota cleared")
    print(f"set: in force on both replicas after {took_set:.2f} s; cleared after {time.monotonic() - began:.2f} s")


def test_bounces_and_named_senders_pass_when_exempted(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    set_quota(s, kind=kind("queue"), subject=queue, mails_per_s=0.1, burst_mails=1, exempt_bounces=True,
              exempt_senders=["postmaster@ours.test"])
    stub = s.stubs[0]
    wait_until(lambda: enqueue(stub, inline(queue, simple_mail("n"))) is not None, timeout=PROPAGATION_S * 2,
               what="the queue's quota in force")
    for i in range(5):
        assert enqueue(stub, inline(queue, simple_mail(f"bounce{i}", sender=""))) is None
        assert enqueue(stub, inline(queue, simple_mail(f"pm{i}", sender="postmaster@ours.test"))) is None
    e = enqueue(stub, inline(queue, simple_mail("n2", sender="someone@else.test")))
    assert e is not None and e.code() == EXHAUSTED
    assert details(e)[1].violations[0].subject == f"queue:{queue}"


def test_depth_limit_refuses_writes_nothing_and_accepts_once_drained(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    set_quota(s, kind=kind("queue"), subject=queue, max_queued_mails=3)
    stub = s.stubs[1]
    for i in range(3):
        assert enqueue(stub, inline(queue, simple_mail(f"d{i}"))) is None
    # The counters (read each refresh) show the queue full on both replicas
    wait_until(lambda: all(r.metric("mailqueue_quota_use_ratio", kind="queue", subject=queue, limit="max_queued_mails") >= 1
                           for r in s.replicas), timeout=PROPAGATION_S * 2, what="the depth seen full")
    # When one more comes, with content no other mail has
    content = f"Subject: refused {time.monotonic_ns()}\r\n\r\nnot queued\r\n".encode()
    for r_stub in s.stubs:
        e = enqueue(r_stub, inline(queue, simple_mail("over", sender="z@depth.test"), content))
        # Then it is refused with the depth limit named, and a wait
        assert e is not None and e.code() == EXHAUSTED, e
        retry, failure = details(e)
        assert failure.violations[0].subject == f"queue:{queue}"
        assert failure.violations[0].description.startswith("max_queued_mails")
        assert retry.retry_delay.seconds >= 1
    # And it wrote nothing: no view row, no broker message, no blob
    assert sorted(m.mail.name for m in s.browsed_mails(queue)) == ["d0", "d1", "d2"]
    assert message_count(queue) == 3
    with pytest.raises(grpc.RpcError) as stat:
        s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content).hexdigest()))
    assert stat.value.code() == grpc.StatusCode.NOT_FOUND
    # When the queue is drained, it accepts again
    consumer = StreamConsumer(s.dequeue_stub, queue)
    for d in consumer.take(3):
        consumer.answer(d, "SUCCESS", "")
    consumer.close()
    wait_until(lambda: enqueue(stub, inline(queue, simple_mail("after"))) is None, timeout=PROPAGATION_S * 3,
               what="the drained queue accepting")


def test_a_batch_answers_each_mail_with_its_own_status(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    sender = f"b{time.monotonic_ns()}@batch.test"
    set_quota(s, kind=kind("sender"), subject=sender, mails_per_s=0.01, burst_mails=4)
    stub = s.stubs[0]
    # A burst of 4 split between 2 replicas: 2 each
    wait_until(lambda: enqueue(stub, inline(queue, simple_mail("probe", sender=sender))) is not None,
               timeout=PROPAGATION_S * 2, what="the sender's quota in force")
    other = s.stubs[1]
    batch = enqueue_pb2.EnqueueBatchesRequest(mails=[
        enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}", sender=sender if i % 2 else "")))
        for i in range(6)])
    results = [r for response in other.EnqueueBatches(iter([batch]), metadata=AUTH, timeout=10) for r in response.results]
    by_seq = {r.sequence: r for r in results}
    assert len(by_seq) == 6
    ok = [i for i in range(1, 6, 2) if by_seq[i].WhichOneof("result") == "receipt"]
    assert len(ok) == 2  # the other replica's share of the burst
    for i in range(0, 6, 2):  # bounces: no sender quota applies
        assert by_seq[i].WhichOneof("result") == "receipt"
    refused = [by_seq[i].error for i in range(1, 6, 2) if i not in ok]
    assert [e.code for e in refused] == [EXHAUSTED.value[0]]
    failure = error_details_pb2.QuotaFailure()
    retry = error_details_pb2.RetryInfo()
    assert refused[0].details[0].Unpack(retry) and refused[0].details[1].Unpack(failure)
    assert failure.violations[0].subject == f"sender:{sender}" and retry.retry_delay.seconds > 0
