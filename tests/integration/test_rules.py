"""Operator rules (#15.1): hold and bounce, for queued mails and new ones, through gRPC."""

import datetime as dt
import queue as q
import uuid

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2
from services.domain import model
from stack.harness import wait_until
from tests.integration.helpers import StreamConsumer, dead_letter_count, deleted_reason, inline, simple_mail


def add_rule(suite, kind, seconds=3600, **condition) -> admin_pb2.AddRuleResponse:
    rule = admin_pb2.Rule(kind=getattr(admin_pb2, f"RULE_KIND_{kind.upper()}"), reason="test rule", **condition)
    rule.expires_at.FromDatetime(dt.datetime.utcnow() + dt.timedelta(seconds=seconds))
    return suite.admin_stub.AddRule(admin_pb2.AddRuleRequest(rule=rule))


def dequeue_sees(suite, rule_id: str) -> bool:
    """dequeue_svc applies the rule (its rule book refreshes every REFRESH_S seconds)."""
    dequeuer = suite.dequeue.app.service()
    return any(str(r.rule_id) == rule_id for r in suite.run(dequeuer.rules.current()))


def test_hold_keeps_matching_mails_queued_and_new_ones_too_until_lifted_then_they_go_out_in_order(suite):
    queue = suite.new_queue()
    first = suite.enqueue_mail(queue, "held-1", recipients=("rcpt@held.example",)).enqueue_id
    other = suite.enqueue_mail(queue, "free", recipients=("rcpt@example.org",)).enqueue_id
    rule = add_rule(suite, "hold", queue=queue, recipient_domain="HELD.example").rule
    assert rule.recipient_domain == "held.example" and rule.rule_id
    wait_until(lambda: dequeue_sees(suite, rule.rule_id), timeout=5, what="the rule on every replica within 5 s")
    second = suite.enqueue_mail(queue, "held-2", recipients=("rcpt@held.example",)).enqueue_id  # enqueued while the rule lives
    c = StreamConsumer(suite.dequeue_stub, queue)
    d = c.next(timeout=5)
    assert d.mail.enqueue_id == other
    c.answer(d)
    wait_until(lambda: suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason="held") == 2, what="both matching mails held")
    with pytest.raises(q.Empty):
        c.next(timeout=0.5)
    i = suite.info(queue)
    assert (i.size, i.held, i.ready) == (2, 2, 0)
    assert [r.rule_id for r in suite.admin_stub.ListRules(admin_pb2.ListRulesRequest()).rules].count(rule.rule_id) == 1
    assert suite.admin_stub.LiftRule(admin_pb2.LiftRuleRequest(rule_id=rule.rule_id)).released == 2
    got = [c.next(timeout=5) for _ in range(2)]
    assert [g.mail.enqueue_id for g in got] == [first, second]
    for g in got:
        c.answer(g)
    c.close()
    assert rule.rule_id not in [r.rule_id for r in suite.admin_stub.ListRules(admin_pb2.ListRulesRequest()).rules]


def test_a_rule_on_an_address_literal_bounces_the_mail_sent_to_it(suite):
    """Recipients may be address literals (x@[192.0.2.1]): a rule names that domain as they do."""
    queue = suite.new_queue()
    literal = suite.enqueue_mail(queue, "to-literal", recipients=("rcpt@[192.0.2.1]",)).enqueue_id
    other = suite.enqueue_mail(queue, "other", recipients=("rcpt@example.org",)).enqueue_id
    r = add_rule(suite, "bounce", queue=queue, recipient_domain="[192.0.2.1]")
    assert r.rule.recipient_domain == "[192.0.2.1]" and r.applied == 1
    c = StreamConsumer(suite.dequeue_stub, queue)  # its message dead-lettered as the consumer meets it
    d = c.next(timeout=5)
    assert d.mail.enqueue_id == other
    c.answer(d)
    c.close()
    wait_until(lambda: dead_letter_count(queue) == 1, what="the literal's mail dead-lettered")
    assert deleted_reason(suite, queue, uuid.UUID(literal)) == f"bounced: test rule (rule {r.rule.rule_id})"
    suite.admin_stub.LiftRule(admin_pb2.LiftRuleRequest(rule_id=r.rule.rule_id))


def test_held_mails_go_out_when_their_rule_expires(suite):
    queue = suite.new_queue()
    rule = add_rule(suite, "hold", seconds=3, queue=queue).rule
    wait_until(lambda: dequeue_sees(suite, rule.rule_id), timeout=5, what="the rule applied")
    eid = suite.enqueue_mail(queue, "patient", recipients=("rcpt@example.org",)).enqueue_id
    c = StreamConsumer(suite.dequeue_stub, queue)
    d = c.next(timeout=10)
    assert d.mail.enqueue_id == eid
    assert model.utcnow() >= rule.expires_at.ToDatetime(tzinfo=dt.timezone.utc)  # not before the rule ended
    c.answer(d)
    c.close()


def test_a_hold_whose_schedule_write_failed_publishes_one_held_copy(suite, monkeypatch):
    """A hold publishes the held copy, then records its schedule. That write failing (Cassandra not
    answering) retried the whole preparation, which held the mail again and published a second
    copy: two copies of one generation came out when the rule ended (two dequeue_svc replicas could
    each deliver one). The retry now finishes the hold it began."""
    from services.adapters.cassandra.deleted_mails import DeletedMailsDAO
    from services.domain.errors import BackendUnavailable

    queue = suite.new_queue()
    rule = add_rule(suite, "hold", seconds=4, queue=queue).rule
    wait_until(lambda: dequeue_sees(suite, rule.rule_id), timeout=5, what="the rule applied")
    schedule, failed = DeletedMailsDAO.schedule, []

    async def failing_once(self, q_, *more) -> None:  # noqa: ANN001
        if q_.queue == queue and q_.held_by is not None and not failed:
            failed.append(q_.enqueue_id)
            raise BackendUnavailable("cassandra", "the hold's schedule write timed out (injected)")
        await schedule(self, q_, *more)

    monkeypatch.setattr(DeletedMailsDAO, "schedule", failing_once)
    eid = suite.enqueue_mail(queue, "held-once", recipients=("rcpt@example.org",)).enqueue_id
    c = StreamConsumer(suite.dequeue_stub, queue, prefetch=4)
    try:
        d = c.next(timeout=30)
        assert d.mail.enqueue_id == eid and [str(x) for x in failed] == [eid]
        c.answer(d)
        with pytest.raises(q.Empty):
            c.next(timeout=3)
    finally:
        c.close()
    # Acked without handing out: the original message once ("held"), and no copy besides (a twin
    # came out as "deleted" after the SUCCESS, or "in-flight" beside the first).
    assert suite.metric("dequeue", "mailqueue_skipped_total", queue=queue, reason="held") == 1
    assert suite.metric("dequeue", "mailqueue_skipped_total", queue=queue) == 1


def test_bounce_dead_letters_queued_and_new_matching_mails_with_the_rule_reason(suite):
    queue = suite.new_queue()
    queued = suite.enqueue_mail(queue, "spam-1", recipients=("rcpt@spam.example",)).enqueue_id
    keep = suite.enqueue_mail(queue, "ham", recipients=("rcpt@example.org",)).enqueue_id
    r = add_rule(suite, "bounce", queue=queue, recipient_domain="spam.example")
    assert r.applied == 1  # the queued one, at once
    assert suite.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 1
    wait_until(lambda: dequeue_sees(suite, r.rule.rule_id), timeout=5, what="the rule applied")
    new = suite.enqueue_mail(queue, "spam-2", recipients=("rcpt@spam.example",)).enqueue_id
    c = StreamConsumer(suite.dequeue_stub, queue)
    d = c.next(timeout=5)
    assert d.mail.enqueue_id == keep
    c.answer(d)
    wait_until(lambda: dead_letter_count(queue) == 2, what="both spam mails dead-lettered")
    for eid in (queued, new):
        assert deleted_reason(suite, queue, uuid.UUID(eid)) == f"bounced: test rule (rule {r.rule.rule_id})"
    with pytest.raises(q.Empty):
        c.next(timeout=0.5)
    c.close()
    suite.admin_stub.LiftRule(admin_pb2.LiftRuleRequest(rule_id=r.rule.rule_id))


def test_a_rule_on_a_sender_matches_it_in_any_case_and_the_null_sender_by_its_brackets(suite):
    """Producers and operators spell one address differently: Spammer@Example.COM is the sender
    spammer@example.com."""
    queue = suite.new_queue()
    spam, bounce, _ = (suite.enqueue_receipt(inline(queue, simple_mail(name, sender=sender))).enqueue_id
                       for name, sender in (("spam", "spammer@example.com"), ("a-bounce", ""), ("ham", "friend@example.com")))
    by_sender = add_rule(suite, "bounce", queue=queue, sender="Spammer@Example.COM")
    by_null = add_rule(suite, "bounce", queue=queue, sender="<>")
    assert (by_sender.applied, by_null.applied) == (1, 1)
    assert deleted_reason(suite, queue, uuid.UUID(spam)) == f"bounced: test rule (rule {by_sender.rule.rule_id})"
    assert deleted_reason(suite, queue, uuid.UUID(bounce)) == f"bounced: test rule (rule {by_null.rule.rule_id})"
    assert suite.size(queue) == 1
    for r in (by_sender, by_null):
        suite.admin_stub.LiftRule(admin_pb2.LiftRuleRequest(rule_id=r.rule.rule_id))


@pytest.mark.parametrize("rule,message", [
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD), "needs a condition"),
    (admin_pb2.Rule(queue="q"), "kind"),
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD, recipient_domain="a@b"), "not a domain"),
    # as a throttle's or a site's domain: letters, digits, '-' and '.'
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD, recipient_domain="not a domain <x>"), "not a domain"),
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD, queue="bad name"), "queue name"),
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_HOLD, recipient_domain="[192.0.2.1"), "not a domain"),
    # a sender that is no address would match nothing, silently
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_BOUNCE, sender="not an address"), "rule.sender"),
    (admin_pb2.Rule(kind=admin_pb2.RULE_KIND_BOUNCE, sender=" "), "rule.sender"),
])
def test_invalid_rules_are_refused(suite, rule, message):
    if rule.kind:
        rule.expires_at.FromDatetime(dt.datetime.utcnow() + dt.timedelta(hours=1))  # refused for its field alone
    before = {r.rule_id for r in suite.admin_stub.ListRules(admin_pb2.ListRulesRequest()).rules}
    with pytest.raises(grpc.RpcError) as e:
        suite.admin_stub.AddRule(admin_pb2.AddRuleRequest(rule=rule))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details()
    # nothing written (an earlier test's rule may expire meanwhile: no new one, not the same list)
    assert {r.rule_id for r in suite.admin_stub.ListRules(admin_pb2.ListRulesRequest()).rules} <= before


def test_a_rule_beyond_30_days_or_in_the_past_is_refused_and_an_unknown_id_is_not_found(suite):
    for seconds in (-10, 31 * 86400):
        with pytest.raises(grpc.RpcError) as e:
            add_rule(suite, "hold", seconds=seconds, queue="anything")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for rule_id, code in ((str(uuid.uuid4()), grpc.StatusCode.NOT_FOUND), ("not-a-uuid", grpc.StatusCode.INVALID_ARGUMENT),
                          ("zz", grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as e:
            suite.admin_stub.LiftRule(admin_pb2.LiftRuleRequest(rule_id=rule_id))
        assert e.value.code() == code, rule_id


