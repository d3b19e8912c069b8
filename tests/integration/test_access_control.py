"""Tokens and roles, through gRPC: wrong or missing token does nothing."""

import hashlib
import os

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2_grpc
from services.adapters.grpc_channels import blocking_channel
from tests.integration.helpers import code_of, inline, simple_mail

TOKENS = {role: role[0] * 24 for role in ("admin", "producer", "consumer", "reader")}


@pytest.fixture(scope="module")
def secured(aio_loop, running_stack):
    from stack.harness import new_keyspace
    from tests.conftest import Suite

    # admin and producer given by their digests only (what a pod should hold), the others as themselves
    given = {r: f"sha256:{hashlib.sha256(t.encode()).hexdigest()}" if r in ("admin", "producer") else t for r, t in TOKENS.items()}
    s = Suite(aio_loop, new_keyspace(), MAILQUEUE_TOKENS=",".join(f"{r}:{t}" for r, t in given.items()),
              MAILQUEUE_SERVICE_TOKEN=TOKENS["admin"])
    yield s
    s.stop(drop=True)


def stubs(s, token=""):
    return (
        enqueue_pb2_grpc.EnqueueServiceStub(blocking_channel(s.enqueue.target, token)),
        browse_pb2_grpc.BrowseServiceStub(blocking_channel(s.browse.target, token)),
        admin_pb2_grpc.AdminServiceStub(blocking_channel(s.browse.target, token)),
        dequeue_pb2_grpc.DequeueServiceStub(blocking_channel(s.dequeue.target, token)),
    )


def test_roles(secured):
    _, _, admin, _ = stubs(secured, TOKENS["admin"])
    queue = "secured-q"
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
    enq, browse, adm, deq = stubs(secured, TOKENS["producer"])
    assert code_of(lambda: enq.Enqueue(inline(queue, simple_mail("m1")))) == grpc.StatusCode.OK
    assert code_of(lambda: browse.GetSize(browse_pb2.GetSizeRequest(queue=queue))) == grpc.StatusCode.PERMISSION_DENIED

    enq, browse, adm, deq = stubs(secured, TOKENS["reader"])
    assert browse.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 1
    assert code_of(lambda: list(adm.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue)))) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: enq.Enqueue(inline(queue, simple_mail("m2")))) == grpc.StatusCode.PERMISSION_DENIED
    assert browse.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 1  # nothing was done

    enq, browse, adm, deq = stubs(secured, TOKENS["consumer"])
    responses = deq.Dequeue(iter([dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue))]))
    assert next(responses).WhichOneof("kind") == "subscribed"
    responses.cancel()

    _, _, adm, _ = stubs(secured, TOKENS["admin"])
    assert list(adm.ClearQueue(admin_pb2.ClearQueueRequest(queue=queue)))[-1].progress.deleted == 1


@pytest.mark.parametrize("token", ["", "x" * 24])
def test_missing_or_unknown_token_is_unauthenticated_and_does_nothing(secured, token):
    queue = "secured-q2"
    stubs(secured, TOKENS["admin"])[2].CreateQueue(admin_pb2.CreateQueueRequest(queue=queue))
    enq, browse, adm, _ = stubs(secured, token)
    assert code_of(lambda: enq.Enqueue(inline(queue, simple_mail()))) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: list(browse.Browse(browse_pb2.BrowseRequest(queue=queue)))) == grpc.StatusCode.UNAUTHENTICATED
    reader = stubs(secured, TOKENS["reader"])[1]
    assert reader.GetSize(browse_pb2.GetSizeRequest(queue=queue)).size == 0


def test_refused_calls_are_counted_with_every_other_call(secured):
    """mailqueue_rpc_total counts every call by its status: a client with a wrong token, or a role
    that may not, shows there (an alert on UNAUTHENTICATED finds a misconfigured client)."""
    method = "/mailqueue.v1.EnqueueService/Enqueue"

    def counted(code: str) -> float:
        return secured.metric("enqueue", "mailqueue_rpc_total", method=method, code=code)

    before = counted("UNAUTHENTICATED"), counted("PERMISSION_DENIED")
    assert code_of(lambda: stubs(secured, "y" * 24)[0].Enqueue(inline("secured-q", simple_mail()))) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: stubs(secured, TOKENS["reader"])[0].Enqueue(inline("secured-q", simple_mail()))) == grpc.StatusCode.PERMISSION_DENIED
    assert (counted("UNAUTHENTICATED"), counted("PERMISSION_DENIED")) == (before[0] + 1, before[1] + 1)


def test_health_needs_no_token(secured):
    with grpc.insecure_channel(secured.enqueue.target) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING


def test_a_service_token_blob_svc_refuses_turns_the_service_not_serving_and_says_what_to_fix(secured):
    from enqueue_svc.app import EnqueueApp
    from services.domain.errors import BackendUnavailable
    from tests.inprocess import RunningApp

    _, _, admin, _ = stubs(secured, TOKENS["admin"])
    admin.CreateQueue(admin_pb2.CreateQueueRequest(queue="secured-token"))
    wrong = RunningApp(secured.loop, EnqueueApp, "enqueue", {**secured.env, "MAILQUEUE_SERVICE_TOKEN": "w" * 24})
    try:
        with pytest.raises(BackendUnavailable) as e:
            secured.run(wrong.app.check())  # what the runtime's health supervision runs
        assert "MAILQUEUE_SERVICE_TOKEN" in str(e.value)
        enq = enqueue_pb2_grpc.EnqueueServiceStub(blocking_channel(wrong.target, TOKENS["producer"]))
        with pytest.raises(grpc.RpcError) as rpc:
            # Over 64 KiB: the content goes to blob_svc (smaller content is written to Cassandra directly).
            enq.Enqueue(inline("secured-token", simple_mail("refused"), os.urandom(100_000)))
        assert rpc.value.code() == grpc.StatusCode.UNAVAILABLE and "MAILQUEUE_SERVICE_TOKEN" in rpc.value.details()
        _, browse, _, _ = stubs(secured, TOKENS["admin"])
        assert browse.GetSize(browse_pb2.GetSizeRequest(queue="secured-token")).size == 0  # nothing written
    finally:
        wrong.stop()


@pytest.mark.parametrize("method,kind", [("/mailqueue.v1.EnqueueService/Enqueue", "unary"),
                                         ("/mailqueue.v1.DequeueService/Dequeue", "bidi")])
def test_an_undecodable_body_without_a_token_is_unauthenticated(secured, method, kind):
    from tests.integration.test_defects import GARBAGE, raw_call

    target = secured.enqueue.target if "Enqueue" in method else secured.dequeue.target
    with grpc.insecure_channel(target) as ch:
        assert code_of(raw_call(ch, method, kind, GARBAGE)) == grpc.StatusCode.UNAUTHENTICATED


def test_a_denied_dequeue_is_always_permission_denied(secured):
    # About 1 in 300 used to end INTERNAL ("Internal error from Core"): a coroutine deny on a stream.
    _, _, _, deq = stubs(secured, TOKENS["producer"])
    codes = {}
    for _ in range(300):
        c = code_of(lambda: list(deq.Dequeue(iter([dequeue_pb2.DequeueRequest(
            subscribe=dequeue_pb2.Subscribe(queue="secured-q"))]), timeout=10)))
        codes[c] = codes.get(c, 0) + 1
    assert codes == {grpc.StatusCode.PERMISSION_DENIED: 300}


def test_only_an_admin_registers_or_lists_webhooks(secured):
    """Where events (with their senders and names) go is the admin's to say: no other role may even list it."""
    from mailqueue.v1 import webhooks_pb2, webhooks_pb2_grpc

    def stub(role: str) -> webhooks_pb2_grpc.WebhookAdminServiceStub:
        return webhooks_pb2_grpc.WebhookAdminServiceStub(blocking_channel(secured.browse.target, TOKENS[role]))

    add = webhooks_pb2.AddWebhookRequest(webhook=webhooks_pb2.Webhook(name="secured-hook", url="https://h.example/", secret_file="/s"))
    for role in ("producer", "consumer", "reader"):
        assert code_of(lambda: stub(role).AddWebhook(add)) == grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
        assert code_of(lambda: stub(role).ListWebhooks(webhooks_pb2.ListWebhooksRequest())) == grpc.StatusCode.PERMISSION_DENIED  # noqa: B023
    assert list(stub("admin").ListWebhooks(webhooks_pb2.ListWebhooksRequest()).webhooks) == []  # nothing was added
    assert stub("admin").AddWebhook(add).webhook.name == "secured-hook"
    assert code_of(lambda: stub("reader").RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name="secured-hook"))) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert [w.name for w in stub("admin").ListWebhooks(webhooks_pb2.ListWebhooksRequest()).webhooks] == ["secured-hook"]
