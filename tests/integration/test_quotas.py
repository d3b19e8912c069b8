"""Enqueue quotas and depth limits (issue #50), through gRPC on the real stack.

Two enqueue replicas of a keyspace of their own (so no other test's replica is a member sharing
the rates), with access control: one token names the tenant ``acme`` (``producer@acme:...``)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess
import sys
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from mailqueue.v1 import admin_pb2, blob_pb2, enqueue_pb2, enqueue_pb2_grpc, events_pb2, events_pb2_grpc, quotas_pb2
from stack.harness import ServiceProcess, new_keyspace, service_env, wait_until
from tests.conftest import BaseSuite, drop_keyspace
from tests.integration.helpers import StreamConsumer, inline, message_count, simple_mail

ROOT = pathlib.Path(__file__).parents[2]
ACME = "acmeacmeacmeacme0001"
OTHER = "otherotherother00002"
AUTH = (("authorization", f"Bearer {ACME}"),)
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
#: The bound the docs state: a change is enforced by every replica within REFRESH_S plus one read
#: (1.0-1.1 s measured on an idle machine; 3 s allows for a store read slowed by a loaded machine).
PROPAGATION_S = 3.0


class QuotaSuite(BaseSuite):
    """browse, dequeue and blob as the suite's, and two enqueue replicas with access control,
    all started at once (then each waited for)."""

    kind = "processes"

    def __init__(self, loop, keyspace: str) -> None:
        self.loop, self.keyspace = loop, keyspace
        env = service_env(keyspace)
        env.pop("MAILQUEUE_PORT"), env.pop("MAILQUEUE_METRICS_PORT")
        secured = {**env, "MAILQUEUE_TOKENS": f"producer@acme:{ACME},producer:{OTHER}"}
        self.blob, self.dequeue, self.browse = (ServiceProcess(n, env, metrics=True, wait=False) for n in ("blob", "dequeue", "browse"))
        self.replicas = [ServiceProcess("enqueue", secured, metrics=True, wait=False) for _ in range(2)]
        self.processes = [self.blob, self.dequeue, self.browse, *self.replicas]
        for p in self.processes:
            p.wait_serving()
        self.enqueue = self.replicas[0]
        self.stubs = [enqueue_pb2_grpc.EnqueueServiceStub(r.channel()) for r in self.replicas]
        self._connect()

    def stop(self) -> None:
        for p in self.processes:
            p.stop()


@pytest.fixture(scope="module")
def quota_suite(aio_loop, running_stack):
    keyspace = new_keyspace()
    s = QuotaSuite(aio_loop, keyspace)
    try:
        wait_until(lambda: all(r.metric("mailqueue_quota_members") == 2 for r in s.replicas), timeout=15, what="two members")
        yield s
    finally:
        s.stop()
        drop_keyspace(keyspace)


def mailq(s, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """This checkout's mailq (``python -m mailq``: the installed entry point may be another checkout's)."""
    r = subprocess.run([sys.executable, "-m", "mailq", "--browse", s.browse.target, *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) is ok, r.stderr
    return r


def set_quota(s, **fields) -> quotas_pb2.Quota:
    return s.admin_stub.SetQuota(admin_pb2.SetQuotaRequest(quota=quotas_pb2.Quota(**fields))).quota


def set_sender_quota(s, sender: str, burst_mails: int) -> None:
    """A sender's burst refilling at 0.01 mail/s (nothing within a test), once every replica has it."""
    set_quota(s, kind=kind("sender"), subject=sender, mails_per_s=0.01, burst_mails=burst_mails)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="sender", subject=sender) > 0 for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="the sender's quota on both replicas")


def limited_sender(s, tag: str, burst_mails: int) -> tuple[str, str]:
    """A new queue, and a sender of its own with a quota of ``burst_mails`` (set_sender_quota)."""
    sender = f"s{time.monotonic_ns()}@{tag}.test"
    set_sender_quota(s, sender, burst_mails=burst_mails)
    return s.new_queue(), sender


def clear_quota(s, kind_name: str, subject: str) -> bool:
    return s.admin_stub.ClearQuota(admin_pb2.ClearQuotaRequest(kind=kind(kind_name), subject=subject)).cleared


def kind(name: str) -> int:
    return getattr(quotas_pb2, f"QUOTA_KIND_{name.upper()}")


def enqueue(stub, request, auth=AUTH) -> grpc.RpcError | None:
    """None when accepted, else the error (a grpc.Call as well)."""
    try:
        stub.Enqueue(request, metadata=auth, timeout=10)
        return None
    except grpc.RpcError as e:
        return e


def details(call) -> tuple[error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure]:
    status = rpc_status.from_call(call)
    assert status is not None, "no google.rpc.Status in the trailers"
    retry, failure = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
    assert [d.Unpack(retry) or d.Unpack(failure) for d in status.details] == [True, True]
    return retry, failure


def refused_on_every_replica(s, queue: str, sender: str, limit: str, says: str = "") -> bytes:
    """One mail over ``queue``'s ``limit``, sent to each replica with content no other mail has:
    each answers RESOURCE_EXHAUSTED naming the queue and the limit (and ``says``), with a wait of
    1 s or more. The content, so that the caller checks no blob holds it."""
    content = f"Subject: refused {time.monotonic_ns()}\r\n\r\nnot queued\r\n".encode()
    for r_stub in s.stubs:
        e = enqueue(r_stub, inline(queue, simple_mail("over", sender=sender), content))
        assert e is not None and e.code() == EXHAUSTED, e
        retry, failure = details(e)
        assert failure.violations[0].subject == f"queue:{queue}"
        assert failure.violations[0].description.startswith(limit), failure
        assert says in failure.violations[0].description and retry.retry_delay.seconds >= 1
    return content


def limit_acme(s, rate: float, burst: int) -> None:
    """The tenant acme limited to ``rate`` mails/s with ``burst``, once both replicas enforce it."""
    set_quota(s, kind=kind("tenant"), subject="acme", mails_per_s=rate, burst_mails=burst)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="tenant", subject="acme") == rate for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="the quota on both replicas")


def unlimit_acme(s) -> None:
    """acme's quota cleared, once both replicas dropped it (the next tests send as acme)."""
    assert clear_quota(s, "tenant", "acme")
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="tenant", subject="acme") == 0 for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="acme's quota gone from both replicas")


def test_two_replicas_share_a_tenant_rate(quota_suite):
    # Given the tenant acme limited to 2 mails/s with a burst of 2, across both replicas (a low
    # rate, so that four clients exceed it even on a loaded machine where an accepted call takes 1 s)
    s = quota_suite
    queue = s.new_queue()
    rate, burst = 2, 2
    limit_acme(s, rate, burst)
    # When each replica is offered as many mails as two clients can send, for 20 s
    window, accepted, done, refused, lock = 20.0, [0, 0], [], [], threading.Lock()
    start = time.monotonic()

    def offer(n: int) -> None:
        i = 0
        while time.monotonic() < start + window:
            i += 1
            e = enqueue(s.stubs[n], inline(queue, simple_mail(f"r{i}")))
            with lock:
                if e is None:
                    accepted[n] += 1
                    done.append(time.monotonic())
                else:
                    refused.append(e)

    threads = [threading.Thread(target=offer, args=(n,)) for n in (0, 1, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then the total accepted is limit x time + burst, at most 5 % over (more: a limit not shared)
    # and at most 10 % under (fewer: a share left unused), time running from the first offer to the last accepted
    # answer (every accepted mail was checked in between), and some were refused; each replica
    # took more than its half of the burst (both enforce a share).
    elapsed = max(done) - start
    bound = rate * elapsed + burst
    print(f"accepted {accepted} in {elapsed:.2f} s (bound {bound:.1f}: {sum(accepted) / bound:.3f} of it), refused {len(refused)}")
    try:
        assert 0.9 * bound <= sum(accepted) <= 1.05 * bound  # alone 0.97-1.01; a loaded machine leaves slots unused
        assert min(accepted) > burst / 2
        assert refused and all(e.code() == EXHAUSTED for e in refused)
        # And each refusal tells how long to wait and which quota, decoded by the stock library
        retry, failure = details(refused[-1])
        assert 0 < retry.retry_delay.ToTimedelta().total_seconds() <= 1.0
        assert failure.violations[0].subject == "tenant:acme"
        assert "mails_per_s" in failure.violations[0].description
    finally:
        unlimit_acme(s)


def test_a_tenant_whose_calls_reach_one_replica_is_served_its_whole_rate(quota_suite):
    # Given acme limited to 4 mails/s with a burst of 2 across both replicas, and every call of
    # acme reaching replica 0 (one client connection: a Service balances connections, not calls)
    s = quota_suite
    queue = s.new_queue()
    rate, burst = 4, 2
    limit_acme(s, rate, burst)
    # When one client offers replica 0 as many mails as it can, for 15 s
    window, accepted, done, refused = 15.0, 0, [], []
    start = time.monotonic()
    i = 0
    while time.monotonic() < start + window:
        i += 1
        e = enqueue(s.stubs[0], inline(queue, simple_mail(f"one{i}")))
        if e is None:
            accepted += 1
            done.append(time.monotonic())
        else:
            refused.append(e)
    # Then replica 0 serves about the whole rate, not its even half: the replicas' heartbeats
    # carry what each was asked for, and the rate follows the demand within a refresh or two
    # (even halves: 0.46-0.48 of the bound; by demand 0.92 alone, 0.63 after the other rate tests),
    # never above the bound (+5 %)
    elapsed = max(done) - start
    bound = rate * elapsed + burst
    print(f"accepted {accepted} in {elapsed:.2f} s through one replica (bound {bound:.1f}: {accepted / bound:.3f} of it), "
          f"refused {len(refused)}")
    try:
        assert 0.55 * bound <= accepted <= 1.05 * bound
        assert refused and all(e.code() == EXHAUSTED for e in refused)
    finally:
        unlimit_acme(s)


def test_a_change_reaches_every_replica_within_the_bound(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    sender = f"x{time.monotonic_ns()}@sender.test"

    def refused_on(stub) -> bool:  # a second mail at once is refused once the sender's quota is in force
        for _ in range(2):
            e = enqueue(stub, inline(queue, simple_mail("c", sender=sender)))
            if e is not None:
                assert details(e)[1].violations[0].subject == f"sender:{sender}", e
                return True
        return False

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


def test_an_exemption_lifts_a_quotas_rates_not_its_depth_limit(quota_suite):
    """A producer writes its envelope sender: a bounce (or an exempt address) must not be a way past
    a queue's depth limit, which keeps the broker's disk."""
    s = quota_suite
    queue = s.new_queue()
    set_quota(s, kind=kind("queue"), subject=queue, max_queued_mails=1, exempt_bounces=True)
    assert enqueue(s.stubs[0], inline(queue, simple_mail("first"))) is None
    wait_until(lambda: all(r.metric("mailqueue_quota_use_ratio", kind="queue", subject=queue, limit="max_queued_mails") >= 1
                           for r in s.replicas), timeout=PROPAGATION_S * 2, what="the depth seen full")
    for stub in s.stubs:
        e = enqueue(stub, inline(queue, simple_mail("bounce", sender="")))
        assert e is not None and e.code() == EXHAUSTED and "max_queued_mails" in details(e)[1].violations[0].description
    assert s.size(queue, exact=True) == 1


def test_a_stream_chunk_larger_than_the_burst_passes_an_idle_byte_quota(quota_suite):
    """As a mail larger than the burst does: it passes an idle limiter and owes the rest (a chunk of
    1 MiB, as mailq sends, against a replica's share of the burst was refused for ever)."""
    s = quota_suite
    queue, sender = s.new_queue(), byte_limited_sender(s, "bigchunk")  # 4,000 bytes at once, split between replicas

    def parts(name: str):
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail(name, sender=sender)))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=os.urandom(6000))

    receipt = s.stubs[0].EnqueueStream(parts("big"), metadata=AUTH, timeout=30).receipt
    assert receipt.size == 6000
    # And it owes: the next one on that replica is refused
    with pytest.raises(grpc.RpcError) as e:
        s.stubs[0].EnqueueStream(parts("next"), metadata=AUTH, timeout=30)
    assert e.value.code() == EXHAUSTED


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
    # When one more comes, with content no other mail has, it is refused with the limit named
    content = refused_on_every_replica(s, queue, "z@depth.test", "max_queued_mails")
    # A streamed mail is refused the same way, before its content is stored
    def parts():
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(
            queue=queue, mail=simple_mail("over-stream", sender="z@depth.test")))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=content + b"streamed")

    with pytest.raises(grpc.RpcError) as streamed:
        stub.EnqueueStream(parts(), metadata=AUTH, timeout=10)
    assert streamed.value.code() == EXHAUSTED and details(streamed.value)[1].violations[0].subject == f"queue:{queue}"
    # And it wrote nothing: no view row, no broker message, no blob
    accepted_content = inline(queue, simple_mail("x")).inline_content  # the blob id is its SHA-256: found
    assert s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(accepted_content).hexdigest())).size == len(accepted_content)
    assert sorted(m.mail.name for m in s.browsed_mails(queue)) == ["d0", "d1", "d2"]
    assert message_count(queue) == 3
    with pytest.raises(grpc.RpcError) as stat:
        s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content).hexdigest()))
    assert stat.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as stat:
        s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content + b"streamed").hexdigest()))
    assert stat.value.code() == grpc.StatusCode.NOT_FOUND
    # When the queue is drained, it accepts again
    consumer = StreamConsumer(s.dequeue_stub, queue)
    for d in consumer.take(3):
        consumer.answer(d, "SUCCESS", "")
    consumer.close()
    wait_until(lambda: enqueue(stub, inline(queue, simple_mail("after"))) is None, timeout=PROPAGATION_S * 3,
               what="the drained queue accepting")


def test_queued_bytes_limit_refuses_writes_nothing_and_accepts_once_drained(quota_suite):
    # Given a queue limited to 250 queued bytes, holding two mails of 100 bytes each
    s = quota_suite
    queue = s.new_queue()
    set_quota(s, kind=kind("queue"), subject=queue, max_queued_bytes=250)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="queue", subject=queue, limit="max_queued_bytes") == 250
                           for r in s.replicas), timeout=PROPAGATION_S * 2, what="the bytes limit on both replicas")
    stub = s.stubs[1]
    sized = lambda i: f"Subject: b{i}\r\n\r\n".encode().ljust(100, b"x")  # noqa: E731
    for i in range(2):
        assert enqueue(stub, inline(queue, simple_mail(f"b{i}"), sized(i))) is None
    # (under the bytes limit: a third is accepted, counted from the counters, not a scan)
    wait_until(lambda: all(r.metric("mailqueue_quota_use_ratio", kind="queue", subject=queue, limit="max_queued_bytes") == 0.8
                           for r in s.replicas), timeout=PROPAGATION_S * 2, what="200 of 250 bytes seen")
    assert enqueue(stub, inline(queue, simple_mail("b2"), sized(2))) is None
    wait_until(lambda: all(r.metric("mailqueue_quota_use_ratio", kind="queue", subject=queue, limit="max_queued_bytes") >= 1
                           for r in s.replicas), timeout=PROPAGATION_S * 2, what="the queue seen at its bytes limit")
    # When one more comes, on either replica, with content no other mail has, it is refused
    content = refused_on_every_replica(s, queue, "z@bytes.test", "max_queued_bytes", "300 bytes")
    # And it wrote nothing: no view row, no broker message, no blob
    assert sorted(m.mail.name for m in s.browsed_mails(queue)) == ["b0", "b1", "b2"]
    assert message_count(queue) == 3
    with pytest.raises(grpc.RpcError) as stat:
        s.blob_stub.Stat(blob_pb2.StatRequest(blob_id=hashlib.sha256(content).hexdigest()))
    assert stat.value.code() == grpc.StatusCode.NOT_FOUND
    # When the queue is drained (its mails leave: their bytes are taken off), it accepts again
    consumer = StreamConsumer(s.dequeue_stub, queue)
    for d in consumer.take(3):
        consumer.answer(d, "SUCCESS", "")
    consumer.close()
    wait_until(lambda: all(r.metric("mailqueue_quota_use_ratio", kind="queue", subject=queue, limit="max_queued_bytes") == 0
                           for r in s.replicas), timeout=PROPAGATION_S * 3, what="the drained queue's bytes gone")
    for r_stub in s.stubs:
        assert enqueue(r_stub, inline(queue, simple_mail("after"), content)) is None


def test_an_idempotent_resend_is_answered_and_not_charged_again(quota_suite):
    # Given a sender's quota of 10 mails at once (5 per replica; 10 if a replica missed the other's
    # heartbeat), refilling at 0.01 mail/s (none within the test), and one keyed mail sent
    s = quota_suite
    queue, sender = limited_sender(s, "resend", burst_mails=10)
    stub = s.stubs[0]
    keyed = inline(queue, simple_mail("keyed", sender=sender), key=f"key-{sender}")
    first = stub.Enqueue(keyed, metadata=AUTH, timeout=10).receipt
    # When it is resent 6 times (more than this replica's share of 5), each resend is answered with
    # the first enqueue, never refused
    for _ in range(6):
        again = stub.Enqueue(keyed, metadata=AUTH, timeout=10).receipt
        assert again.enqueue_id == first.enqueue_id and again.duplicate
    # Then the resends took nothing: new mails still get the rest of the share (4 to 9), then are refused
    accepted = 0
    for i in range(11):
        e = enqueue(stub, inline(queue, simple_mail(f"new{i}", sender=sender)))
        if e is not None:
            assert e.code() == EXHAUSTED and details(e)[1].violations[0].subject == f"sender:{sender}"
            break
        accepted += 1
    # (between the two: a refresh may re-split the shares by demand meanwhile; charged, the 6
    # resends would have left at most 3)
    assert 4 <= accepted <= 9, accepted
    assert sorted(m.mail.name for m in s.browsed_mails(queue)) == sorted(["keyed", *(f"new{i}" for i in range(accepted))])


def test_a_mail_refused_after_its_quota_check_takes_nothing_from_the_quota(quota_suite):
    # Given a sender's quota of 2 mails at once (1 per replica; 2 if a replica missed the other's
    # heartbeat), refilling at 0.01 mail/s, all sent to one replica
    s = quota_suite
    queue, sender = limited_sender(s, "refund", burst_mails=2)
    stub = s.stubs[0]
    # When 3 mails pass the quota check and are then refused (a blob ref no blob has: NOT_FOUND)
    for i in range(3):
        missing = enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(f"missing{i}", sender=sender),
                                             blob_refs=enqueue_pb2.BlobRefs(blob_ids=[f"{i:064x}"]))
        e = enqueue(stub, missing)
        assert e is not None and e.code() == grpc.StatusCode.NOT_FOUND, e
    # Then the quota is whole: a mail is accepted
    assert enqueue(stub, inline(queue, simple_mail("accepted", sender=sender))) is None


def byte_limited_sender(s, tag: str) -> str:
    """A sender of its own with 4,000 bytes at once, refilling at 1 byte/s, once both replicas have it."""
    sender = f"{tag}{time.monotonic_ns()}@bytes.test"
    set_quota(s, kind=kind("sender"), subject=sender, bytes_per_s=1, burst_bytes=4000)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="sender", subject=sender) > 0 for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="the sender's quota on both replicas")
    return sender


def test_blob_refs_are_charged_to_a_byte_quota_at_the_check(quota_suite):
    # Given a sender's byte quota of 4,000 bytes at once, refilling at 1 byte/s, and a blob of 3,000 bytes
    from concurrent.futures import ThreadPoolExecutor

    s = quota_suite
    queue, sender = s.new_queue(), byte_limited_sender(s, "b")
    blob_id = s.blob_stub.PutBytes(blob_pb2.PutBytesRequest(content=os.urandom(3000))).blob_id
    # When 8 mails reference it at once, on one replica
    def by_ref(i: int) -> grpc.RpcError | None:
        return enqueue(s.stubs[0], enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(f"ref{i}", sender=sender),
                                                               blob_refs=enqueue_pb2.BlobRefs(blob_ids=[blob_id])))

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(by_ref, range(8)))
    # Then what the quota allows is accepted (its share's burst, a mail over it when full), the
    # rest refused at their check: their bytes were known there. Charged only after the write,
    # every mail passed the check with 0 bytes before the first was charged.
    accepted = sum(1 for e in outcomes if e is None)
    assert all(e is None or e.code() == EXHAUSTED for e in outcomes), outcomes
    assert 1 <= accepted <= 2, accepted
    assert len(s.browsed_mails(queue)) == accepted


def test_streams_at_once_share_a_byte_quota_as_their_bytes_arrive(quota_suite):
    # Given a sender's byte quota of 4,000 bytes at once, refilling at 1 byte/s
    from concurrent.futures import ThreadPoolExecutor

    s = quota_suite
    queue, sender = s.new_queue(), byte_limited_sender(s, "st")
    # When 8 EnqueueStreams of 3,000 bytes run at once on one replica: each sends its header and
    # 200 bytes, and the rest only once every stream has got that far (or was refused)
    go, lock, paused = threading.Event(), threading.Lock(), [0]

    def requests(i: int):
        yield enqueue_pb2.EnqueueStreamRequest(header=enqueue_pb2.EnqueueHeader(queue=queue, mail=simple_mail(f"st{i}", sender=sender)))
        yield enqueue_pb2.EnqueueStreamRequest(chunk=os.urandom(200))
        with lock:
            paused[0] += 1
        go.wait(30)
        for _ in range(7):
            yield enqueue_pb2.EnqueueStreamRequest(chunk=os.urandom(400))

    def stream(i: int) -> grpc.RpcError | None:
        try:
            s.stubs[0].EnqueueStream(requests(i), metadata=AUTH, timeout=60)
            return None
        except grpc.RpcError as e:
            return e
        finally:
            with lock:
                paused[0] += 1  # ended (the server refused it early): no longer in the way

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream, i) for i in range(8)]
        wait_until(lambda: paused[0] >= 8, 30, what="every stream past its first chunk, or ended")
        go.set()
        outcomes = [f.result() for f in futures]
    # Then what the quota allows is accepted, the rest refused with the quota's details while
    # they streamed; nothing refused was queued. Charged once streamed, all 8 passed together.
    accepted = sum(1 for e in outcomes if e is None)
    assert all(e is None or e.code() == EXHAUSTED for e in outcomes), outcomes
    for e in outcomes:
        if e is not None:
            retry, failure = details(e)
            assert failure.violations[0].subject == f"sender:{sender}" and failure.violations[0].description.startswith("bytes_per_s")
    assert 1 <= accepted <= 2, [(e.code(), e.details()) if e else None for e in outcomes]
    assert len(s.browsed_mails(queue)) == accepted


def test_a_replica_that_stops_leaves_the_members_at_once(quota_suite):
    """A stopped replica's share goes back to the others when it stops, not when its heartbeat
    expires (MEMBER_TTL_S): during a rolling update the others refused mail under the rate."""
    s = quota_suite
    env = service_env(s.keyspace)
    env.pop("MAILQUEUE_PORT"), env.pop("MAILQUEUE_METRICS_PORT")
    third = ServiceProcess("enqueue", env, metrics=True)
    try:
        wait_until(lambda: third.metric("mailqueue_quota_members") == 3, timeout=15, what="a third member")
    finally:
        third.stop(grace=30)  # SIGTERM: it drains and closes
    from services.adapters.cassandra.view import View
    from services.runtime.settings import cassandra_from_env

    view = s.loop.run(View.open(cassandra_from_env(env)))
    try:
        members = s.loop.run(view.quotas.snapshot()).members
    finally:
        view.close()
    assert len(members) == 2, members


def test_a_batch_answers_each_mail_with_its_own_status(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    sender = f"b{time.monotonic_ns()}@batch.test"
    # A burst of 2 split between 2 replicas: 1 each (2 if a replica missed the other's heartbeat)
    set_sender_quota(s, sender, burst_mails=2)
    other = s.stubs[1]
    batch = enqueue_pb2.EnqueueBatchesRequest(mails=[
        enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}", sender=sender if i % 2 else "")))
        for i in range(6)])
    results = [r for response in other.EnqueueBatches(iter([batch]), metadata=AUTH, timeout=10) for r in response.results]
    by_seq = {r.sequence: r for r in results}
    assert len(by_seq) == 6
    ok = [i for i in range(1, 6, 2) if by_seq[i].WhichOneof("result") == "receipt"]
    assert 1 <= len(ok) <= 2  # this replica's share of the burst
    for i in range(0, 6, 2):  # bounces: no sender quota applies
        assert by_seq[i].WhichOneof("result") == "receipt"
    refused = [by_seq[i].error for i in range(1, 6, 2) if i not in ok]
    assert refused and all(e.code == EXHAUSTED.value[0] for e in refused)
    for e in refused:
        failure, retry = error_details_pb2.QuotaFailure(), error_details_pb2.RetryInfo()
        assert e.details[0].Unpack(retry) and e.details[1].Unpack(failure)
        assert failure.violations[0].subject == f"sender:{sender}" and retry.retry_delay.seconds > 0


def test_bad_quota_input_is_refused_and_writes_nothing(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    before = s.admin_stub.ListQuotas(admin_pb2.ListQuotasRequest())
    Q = quotas_pb2.Quota
    cases = {
        "no quota": admin_pb2.SetQuotaRequest(),
        "no kind": admin_pb2.SetQuotaRequest(quota=Q(subject="acme", mails_per_s=1)),
        "no limit": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme")),
        "rate zero": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme", mails_per_s=0)),
        "rate negative": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme", mails_per_s=-1)),
        "rate too small (it overflowed to no limit)": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme",
                                                                                       mails_per_s=1e-309)),
        "bytes without burst": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme", bytes_per_s=100)),
        "depth on a tenant": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme", max_queued_mails=5)),
        "depth zero": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("queue"), subject=queue, max_queued_mails=0)),
        "bytes depth on a sender": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("sender"), subject="a@b.org", max_queued_bytes=9)),
        "bytes depth zero": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("queue"), subject=queue, max_queued_bytes=0)),
        "bad sender": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("sender"), subject="nobody", mails_per_s=1)),
        "bad domain": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("sender_domain"), subject="a..b", mails_per_s=1)),
        "empty tenant": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="", mails_per_s=1)),
        "bad queue": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("queue"), subject="no spaces", mails_per_s=1)),
        "bad exempt sender": admin_pb2.SetQuotaRequest(quota=Q(kind=kind("tenant"), subject="acme", mails_per_s=1,
                                                               exempt_senders=["x"])),
    }
    for name, request in cases.items():
        with pytest.raises(grpc.RpcError) as e:
            s.admin_stub.SetQuota(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
    for request in (admin_pb2.ClearQuotaRequest(subject="acme"), admin_pb2.ClearQuotaRequest(kind=kind("sender"), subject="x"),
                    admin_pb2.ClearQuotaRequest(kind=kind("tenant"))):
        with pytest.raises(grpc.RpcError) as e:
            s.admin_stub.ClearQuota(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
    with pytest.raises(grpc.RpcError) as e:
        s.admin_stub.ListQuotas(admin_pb2.ListQuotasRequest(kind=99))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A queue's quota needs the queue
    with pytest.raises(grpc.RpcError) as e:
        s.admin_stub.SetQuota(admin_pb2.SetQuotaRequest(quota=Q(kind=kind("queue"), subject="no-such-queue-q", mails_per_s=1)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert s.admin_stub.ListQuotas(admin_pb2.ListQuotasRequest()) == before


def test_mailq_quota_set_list_clear_is_audited(quota_suite):
    s = quota_suite
    queue = s.new_queue()
    out = mailq(s, "quota", "set", "queue", queue, "--mails-per-s", "50", "--burst-mails", "100", "--max-queued", "1000",
                "--max-queued-bytes", "5000000", "--exempt-bounces", "--exempt-sender", "Postmaster@Ours.test").stdout
    assert queue in out and "50/s burst 100" in out and "bounces, postmaster@ours.test" in out
    listed = mailq(s, "quota", "list", "--kind", "queue").stdout
    assert queue in listed and "1000" in listed and "5000000" in listed and "2 enqueue replica(s)" in listed
    assert "cleared" in mailq(s, "quota", "clear", "queue", queue).stdout
    assert "no such quota" in mailq(s, "quota", "clear", "queue", queue).stdout
    assert "give --mails-per-s" in mailq(s, "quota", "set", "tenant", "acme", ok=False).stderr
    # Recorded: set, then removed (the second clear changed nothing: no event)
    call = events_pb2_grpc.EventServiceStub(s.browse.channel()).WatchEvents(events_pb2.WatchEventsRequest(
        from_oldest=True, queues=[queue], types=[events_pb2.EVENT_TYPE_QUOTA_CHANGED]), timeout=20)
    got = [next(call).event for _ in range(2)]
    call.cancel()
    assert [e.details["change"] for e in got] == ["set", "removed"]
    assert got[0].details["quota"] == f"queue:{queue}" and got[0].details["mails_per_s"] == "50.0"


def paced_latencies(stub, queue: str, auth, per_s: float, seconds: float, name: str) -> tuple[list[float], list]:
    """Enqueue ``per_s`` mails a second for ``seconds`` on ``stub`` (one caller, on a fixed schedule:
    a slow answer does not lower the offered load); (latencies of the accepted, the errors)."""
    latencies, errors, clock = [], [], threading.Event()
    began = time.monotonic()
    for i in range(int(per_s * seconds)):
        clock.wait(max(0.0, began + i / per_s - time.monotonic()))  # the schedule, not a wait for state
        sent = time.monotonic()
        e = enqueue(stub, inline(queue, simple_mail(f"{name}{i}")), auth)
        (errors.append(e) if e is not None else latencies.append(time.monotonic() - sent))
    return latencies, errors


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


def test_a_tenant_under_its_rate_keeps_its_latency_beside_one_over_it(quota_suite):
    """Fairness (issue #50 item 4): acme offers 10x its rate; the other tenant (B), under its own,
    is never refused by a quota and keeps its latency.

    B sends 40 mails/s (two paced callers, one per replica) in 6 rounds of 2 s, alternately alone
    and beside acme offering 50 mails/s against its 5/s (two paced callers): alternating rounds
    let the other work on this shared 2-core machine weigh on both sides alike. The issue asks for
    B's p99 within 10 % of alone. That cannot be asserted here: 6 runs (of 8 rounds) at load average 17-34 gave
    beside/alone p99 ratios of 1.86, 0.19, 0.66, 0.63, 1.33 and 0.73 (B's p99 alone 0.9-6.5 s), so the
    machine's noise is tens of times the 10 % to be shown. The test asserts what the noise cannot
    fake: no B call refused by a quota, acme refused, and B's p99 beside acme at most 2x alone
    plus 0.5 s (above every ratio measured but one, 1.86, which the 0.5 s covers at those p99s);
    a quota path that made B wait on acme (a lock held across a refusal, B's calls charged to
    acme or queued behind its refusals) adds acme's 50 calls/s to every B call. The figures are
    printed; run on a quiet machine to read the 10 %."""
    s = quota_suite
    queue = s.new_queue()
    other = "token:" + hashlib.sha256(OTHER.encode()).hexdigest()[:12]
    b_auth = (("authorization", f"Bearer {OTHER}"),)
    set_quota(s, kind=kind("tenant"), subject="acme", mails_per_s=5, burst_mails=2)
    set_quota(s, kind=kind("tenant"), subject=other, mails_per_s=1000, burst_mails=100)
    wait_until(lambda: all(r.metric("mailqueue_quota_limit", kind="tenant", subject=other) == 1000
                           and r.metric("mailqueue_quota_limit", kind="tenant", subject="acme") == 5 for r in s.replicas),
               timeout=PROPAGATION_S * 2, what="both quotas on both replicas")
    alone, beside, b_errors, a_refused = [], [], [], []

    def run(callers: list[tuple]) -> list[tuple[list[float], list]]:
        out: list = [None] * len(callers)

        def call(n: int) -> None:
            out[n] = paced_latencies(*callers[n])

        threads = [threading.Thread(target=call, args=(n,)) for n in range(len(callers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    for round_ in range(6):
        with_acme = round_ % 2 == 1
        b = [(s.stubs[n], queue, b_auth, 20, 2.0, f"b{round_}-{n}-") for n in (0, 1)]
        a = [(s.stubs[n], queue, AUTH, 25, 2.0, f"a{round_}-{n}-") for n in (0, 1)] if with_acme else []
        results = run(b + a)
        for lat, errors in results[:2]:
            (beside if with_acme else alone).extend(lat)
            b_errors.extend(errors)
        for _, errors in results[2:]:
            a_refused.extend(errors)
    ratio = p99(beside) / p99(alone)
    print(f"B alone: {len(alone)} mails, p99 {1000 * p99(alone):.1f} ms; beside acme: {len(beside)} mails, "
          f"p99 {1000 * p99(beside):.1f} ms (ratio {ratio:.2f}); acme refused {len(a_refused)} of 300; "
          f"B's other errors: {sorted(str(e.code()) for e in b_errors)}")
    # (a call of B that failed otherwise, a deadline on an overloaded machine, is not a refusal)
    assert [e for e in b_errors if e.code() == EXHAUSTED] == [], [e.details() for e in b_errors]
    assert len([e for e in a_refused if e.code() == EXHAUSTED]) > 200  # of 300 offered, at most ~40 accepted
    assert p99(beside) <= 2 * p99(alone) + 0.5
    for subject in ("acme", other):
        assert clear_quota(s, "tenant", subject)


def test_clearing_a_quota_never_set_writes_nothing(suite):
    """ClearQuota of a subject with no quota answered cleared = false but still wrote a tombstone and a
    14-day marker into the partition every enqueue replica reads at each refresh: a script clearing
    many names filled it. It writes nothing now."""
    from services.adapters.cassandra import schema

    names = f"SELECT kind, name FROM {suite.keyspace}.{schema.SHAPING} WHERE part = 1"
    before = sorted(suite.view.session.execute(names))
    for i in range(3):
        assert not clear_quota(suite, "sender", f"never-set-{i}@example.org")
    assert sorted(suite.view.session.execute(names)) == before
    set_quota(suite, kind=kind("sender"), subject="set-once@example.org", mails_per_s=5, burst_mails=5)
    assert clear_quota(suite, "sender", "set-once@example.org")  # one that exists: removed, its marker left
    assert ("gone:quota", "sender|set-once@example.org") in {(r.kind, r.name) for r in suite.view.session.execute(names)}
