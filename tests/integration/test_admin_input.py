"""Admin requests an operator's script sends with a value missing or out of range, through gRPC
and the installed mailq: each is refused with a precise status and changes nothing; and what a
deleted queue leaves behind (nothing: its rules and quota go with it)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, quotas_pb2, shaping_pb2
from tests.integration.helpers import code_of, inline, simple_mail
from tests.integration.test_cli import mailq


def unnamed(queue: str):
    return inline(queue, simple_mail(name=""))


@pytest.mark.parametrize("condition", [{"name": ""}, {"sender": ""}, {"recipient": " "}])
def test_a_delete_or_flush_with_an_empty_condition_is_refused_and_deletes_nothing(suite, condition):
    """An unset variable in a script (grpcurl -d '{"name":"'$N'"}') sets the condition to "": it
    would select every mail without a name, usually the whole queue."""
    queue = suite.new_queue()
    for _ in range(3):
        suite.enqueue_stub.Enqueue(unnamed(queue))
    deleting = suite.admin_stub.DeleteMails(admin_pb2.DeleteMailsRequest(queue=queue, **condition))
    with pytest.raises(grpc.RpcError) as e:
        list(deleting)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "condition is empty" in e.value.details()
    assert code_of(lambda: suite.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue, **condition))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert suite.size(queue, exact=True) == 3


@pytest.mark.parametrize("domain", ["example.org.", " example.org", "a@example.org", ""])
def test_a_flush_by_a_domain_no_recipient_can_have_is_refused(suite, domain):
    """It was taken, and flushed nothing (0, OK), where a rule or a throttle refuses it."""
    queue = suite.new_queue()
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.Flush(admin_pb2.FlushRequest(queue=queue, recipient_domain=domain))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "recipient_domain" in e.value.details()


def test_a_purge_older_than_zero_and_a_republish_without_older_than_are_refused(suite):
    queue = suite.new_queue()
    suite.enqueue_stub.Enqueue(unnamed(queue))
    purge = suite.admin_stub.PurgeDeadLetters(
        admin_pb2.PurgeDeadLettersRequest(queue=queue, older_than=duration_pb2.Duration(seconds=0)))
    with pytest.raises(grpc.RpcError) as e:
        list(purge)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "all = true" in e.value.details()
    unset = admin_pb2.RepublishNotProcessedRequest(queue=queue)  # would read as 0s: every live mail
    assert code_of(lambda: suite.admin_stub.RepublishNotProcessed(unset)) == grpc.StatusCode.INVALID_ARGUMENT
    # And one with an age republishes what is older than it (here: nothing yet)
    later = admin_pb2.RepublishNotProcessedRequest(queue=queue, older_than=duration_pb2.Duration(seconds=3600))
    assert suite.admin_stub.RepublishNotProcessed(later).republished == 0


def test_a_deleted_queue_takes_its_rules_and_quota_with_it_and_its_rules_can_still_be_lifted(suite):
    # Given a queue with a bounce rule, a hold rule and a depth quota
    queue = suite.new_queue()
    bounce = suite.admin_stub.AddRule(admin_pb2.AddRuleRequest(rule=admin_pb2.Rule(
        kind=admin_pb2.RULE_KIND_BOUNCE, queue=queue, recipient_domain="bounced.test", reason="test"))).rule
    hold = suite.admin_stub.AddRule(admin_pb2.AddRuleRequest(rule=admin_pb2.Rule(
        kind=admin_pb2.RULE_KIND_HOLD, queue=queue, recipient_domain="held.test", reason="test"))).rule
    suite.admin_stub.SetQuota(admin_pb2.SetQuotaRequest(quota=quotas_pb2.Quota(
        kind=quotas_pb2.QUOTA_KIND_QUEUE, subject=queue, max_queued_mails=5)))
    # When it is deleted
    list(suite.admin_stub.DeleteQueue(admin_pb2.DeleteQueueRequest(queue=queue, force=True), timeout=120))
    # Then its rules and quota are gone (lifted and cleared, each recorded)
    assert {r.rule_id for r in suite.admin_stub.ListRules(admin_pb2.ListRulesRequest()).rules}.isdisjoint(
        {bounce.rule_id, hold.rule_id})
    listed = suite.admin_stub.ListQuotas(admin_pb2.ListQuotasRequest()).quotas
    assert all(q.subject != queue for q in listed)
    lift = admin_pb2.LiftRuleRequest(rule_id=hold.rule_id)
    assert code_of(lambda: suite.admin_stub.LiftRule(lift)) == grpc.StatusCode.NOT_FOUND  # lifted with the queue
    # And the queue made again under its name accepts mail for those domains, bounces none
    suite.admin_stub.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
    for domain in ("bounced.test", "held.test"):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(name=domain, recipients=(f"a@{domain}",))))
    assert suite.size(queue, exact=True) == 2


def test_a_domain_belongs_to_one_site(suite):
    admin = suite.admin_stub
    suffix = suite.new_queue()  # a unique name
    domain = f"{suffix}.example"
    admin.SetSite(admin_pb2.SetSiteRequest(site=shaping_pb2.Site(name=f"a-{suffix}", domains=[domain])))
    with pytest.raises(grpc.RpcError) as e:
        admin.SetSite(admin_pb2.SetSiteRequest(site=shaping_pb2.Site(name=f"b-{suffix}", domains=[domain, "other.example"])))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and f"a-{suffix}" in e.value.details()
    sites = {s.name: list(s.domains) for s in admin.ListThrottles(admin_pb2.ListThrottlesRequest()).sites}
    assert f"b-{suffix}" not in sites and sites[f"a-{suffix}"] == [domain]
    # Replacing the site that holds it is a change of that site, allowed
    admin.SetSite(admin_pb2.SetSiteRequest(site=shaping_pb2.Site(name=f"a-{suffix}", domains=[domain, "more.example"])))
    admin.DeleteSite(admin_pb2.DeleteSiteRequest(name=f"a-{suffix}"))


def test_a_shaping_pattern_that_could_backtrack_for_seconds_is_refused(suite):
    rule = shaping_pb2.ShapingRule(rule_id="r-redos", pattern="(a+)+$", threshold=3, window=duration_pb2.Duration(seconds=300),
                                   action=shaping_pb2.SHAPING_ACTION_SUSPEND, duration=duration_pb2.Duration(seconds=600))
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.SetShapingRule(admin_pb2.SetShapingRuleRequest(rule=rule))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "a repeat inside a repeat" in e.value.details()


def test_browse_with_content_lists_a_mail_whose_content_is_missing(suite):
    # Given two mails, the first one's content removed from the blob store from outside
    queue = suite.new_queue()
    lost = suite.enqueue_stub.Enqueue(inline(queue, simple_mail("lost"), b"Subject: lost\r\n\r\nlost body\r\n")).receipt
    suite.enqueue_stub.Enqueue(inline(queue, simple_mail("kept"), b"Subject: kept\r\n\r\nkept\r\n"))
    assert suite.blob_stub.Delete(blob_pb2.DeleteRequest(blob_id=lost.blob_ids[0])).existed
    # When they are browsed with their content
    listed = list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, include_content=True)))
    # Then both are listed: the lost one says so, the other has its content
    by_name = {r.mail.mail.name: r for r in listed}
    assert sorted(by_name) == ["kept", "lost"]
    assert by_name["lost"].content_missing and by_name["lost"].content == b""
    assert not by_name["kept"].content_missing and by_name["kept"].content == b"Subject: kept\r\n\r\nkept\r\n"


@pytest.mark.parametrize("args", [
    ["bounce", "--queue", "", "--domain", "x.example"],
    ["hold", "--queue", "", "--domain", "x.example"],
    ["throttle", "set", "x.example", "--queue", "", "--rate", "1/s"],
    ["dead", "redrive", "q", "--to", ""],
])
def test_mailq_refuses_an_empty_queue_option(suite, args):
    """--queue "" would mean every queue (and --to "" the queue itself): an unset variable."""
    r = mailq(suite, *args, ok=False)
    assert r.returncode == 2 and "empty queue name" in r.stderr


def test_a_malformed_request_is_invalid_argument_even_while_the_backends_do_not_answer(keyspace, tmp_path):
    """browse_svc asked the (unconnected) backends before it read the request: a malformed SetQuota,
    ClearQuota, AddRule or WatchEvents cursor answered UNAVAILABLE, and a client that retries those retried
    an invalid request for ever. The request is read first; a valid one is UNAVAILABLE."""
    import signal
    import subprocess
    import sys

    from mailqueue.v1 import admin_pb2_grpc, events_pb2, events_pb2_grpc
    from stack.harness import ROOT, as_service, free_port, service_env, wait_until

    port, log = free_port(), tmp_path / "browse.log"
    env = {**as_service("browse", service_env(keyspace, MAILQUEUE_PORT=str(port), MAILQUEUE_METRICS_PORT=str(free_port()))),
           "MAILQUEUE_CASSANDRA_PORT": str(free_port())}
    with open(log, "wb") as err:
        browse = subprocess.Popen([sys.executable, "-m", "browse_svc"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    admin, events = admin_pb2_grpc.AdminServiceStub(channel), events_pb2_grpc.EventServiceStub(channel)

    def code(call) -> grpc.StatusCode:  # noqa: ANN001
        try:
            call()
        except grpc.RpcError as e:
            return e.code()
        raise AssertionError("answered OK")

    try:
        wait_until(lambda: "cassandra unavailable" in log.read_text(), 30, 0.1, what="a failed connection logged")
        valid = quotas_pb2.Quota(kind=quotas_pb2.QUOTA_KIND_SENDER, subject="a@example.org", mails_per_s=1, burst_mails=1)
        assert code(lambda: admin.SetQuota(admin_pb2.SetQuotaRequest(quota=valid), timeout=10)) == grpc.StatusCode.UNAVAILABLE
        for call in (lambda: admin.SetQuota(admin_pb2.SetQuotaRequest(quota=quotas_pb2.Quota(subject="a")), timeout=10),
                     lambda: admin.ClearQuota(admin_pb2.ClearQuotaRequest(subject="a"), timeout=10),
                     lambda: next(events.WatchEvents(events_pb2.WatchEventsRequest(cursor="not-a-cursor"), timeout=10)),
                     # A rule without a condition, and one already expired: the rule's checks come first too.
                     lambda: admin.AddRule(admin_pb2.AddRuleRequest(rule=admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD)), timeout=10),
                     lambda: admin.AddRule(admin_pb2.AddRuleRequest(rule=admin_pb2.Rule(
                         kind=admin_pb2.RULE_KIND_HOLD, queue="q", expires_at=timestamp_pb2.Timestamp(seconds=1))), timeout=10)):
            assert code(call) == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()
        browse.send_signal(signal.SIGTERM)
        browse.wait(30)
