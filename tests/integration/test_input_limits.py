"""Inputs an outside review found answered INTERNAL, stored where they could never be undone, or
taken silently with another meaning: each is now a precise status that writes nothing. Through
gRPC on the real stack."""

import base64
import struct
import uuid

import grpc
import pytest

from mailqueue.v1 import admin_pb2, browse_pb2, enqueue_pb2, events_pb2, events_pb2_grpc, quotas_pb2, shaping_pb2
from services.domain import paging
from services.domain.filters import BrowseFilter
from tests.integration.helpers import code_of, inline, simple_mail, view_rows


def refused(call, *words: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
    for w in words:
        assert w in e.value.details()


# ---------------------------------------------------------------- a bucket count that could never be lowered
def test_a_bucket_count_beyond_the_maximum_is_refused_and_the_configuration_is_unchanged(suite):
    before = suite.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
    wanted = browse_pb2.ViewConfiguration()
    wanted.CopyFrom(before)
    for count in (1025, 2_147_483_647):
        wanted.bucket_count = count
        refused(lambda: suite.admin_stub.UpdateConfiguration(admin_pb2.UpdateConfigurationRequest(configuration=wanted)),
                "bucket_count must be between 1 and 1024")
    assert suite.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration == before


# ---------------------------------------------------------------- a mail name is a history key
def test_a_mail_name_over_4096_bytes_is_refused_alone_and_writes_nothing(suite):
    queue = suite.new_queue()
    refused(lambda: suite.enqueue_stub.Enqueue(inline(queue, simple_mail("n" * 70_000))), "mail name is 70000 bytes")
    # In a batch, that mail alone is refused: the others, grouped with it, are enqueued.
    requests = [enqueue_pb2.EnqueueManyRequest(sequence=i, request=inline(queue, simple_mail(f"m{i}"))) for i in range(8)]
    requests[3].request.mail.name = "é" * 2049  # 4098 bytes in UTF-8
    answers = {r.sequence: r for r in suite.enqueue_stub.EnqueueMany(iter(requests))}
    assert answers[3].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], answers[3]
    assert all(answers[i].HasField("receipt") for i in range(8) if i != 3)
    assert sorted(q.mail.name for q in view_rows(suite, queue)) == sorted(f"m{i}" for i in range(8) if i != 3)
    # The longest name allowed is enqueued, and its history found by that name.
    longest = "x" * 4096
    receipt = suite.enqueue_stub.Enqueue(inline(queue, simple_mail(longest))).receipt
    events = events_pb2_grpc.EventServiceStub(suite.browse.channel())
    story = events.GetMailHistory(events_pb2.GetMailHistoryRequest(name=longest)).events
    assert [e.enqueue_id for e in story] == [receipt.enqueue_id]


def test_more_blob_refs_than_the_limit_are_refused_before_any_is_read(suite):
    queue = suite.new_queue()
    request = enqueue_pb2.EnqueueRequest(queue=queue, mail=simple_mail(),
                                         blob_refs=enqueue_pb2.BlobRefs(blob_ids=["0" * 64] * 1001))
    refused(lambda: suite.enqueue_stub.Enqueue(request), "blob_refs names 1001 blobs, over the limit of 1000")
    assert view_rows(suite, queue) == []


# ---------------------------------------------------------------- patterns Python's compiler cannot take
@pytest.mark.parametrize("pattern,words", [("a{4294967295}", "not a regular expression"),
                                           ("(" * 499 + ")" * 499, "pattern has 499 groups: at most 100")],
                         ids=["huge repeat", "deep nesting"])
def test_a_shaping_pattern_the_regex_compiler_cannot_take_is_invalid_argument(suite, pattern, words):
    rule = shaping_pb2.ShapingRule(rule_id=f"r{uuid.uuid4().hex[:8]}", pattern=pattern, threshold=3,
                                   action=shaping_pb2.SHAPING_ACTION_SUSPEND)
    rule.window.FromSeconds(60)
    rule.duration.FromSeconds(60)
    refused(lambda: suite.admin_stub.SetShapingRule(admin_pb2.SetShapingRuleRequest(rule=rule)), words)
    listed = suite.admin_stub.ListThrottles(admin_pb2.ListThrottlesRequest())
    assert rule.rule_id not in str(listed)


# ---------------------------------------------------------------- a page token made by hand
def _token(queue: str, partition: int, ms: int) -> str:
    """A token as Browse makes one for an unfiltered listing of ``queue`` (its digest has no
    secret: anyone with the source can make one)."""
    key = paging.request_key(queue, BrowseFilter())
    body = struct.pack(">Bcqq16s", 1, paging.MAILS, partition, ms, uuid.uuid4().bytes)
    return base64.urlsafe_b64encode(body + paging._digest(body, key)).decode().rstrip("=")


def test_a_forged_page_token_with_an_impossible_position_is_invalid_argument(suite):
    queue = suite.new_queue()
    for i in range(3):
        suite.enqueue_stub.Enqueue(inline(queue, simple_mail(f"m{i}")))

    def browse(token: str) -> list:
        return list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, page_size=2, page_token=token)))

    assert len(browse(_token(queue, 0, 0))) == 2  # a made token of a possible position is a token like any
    last = 253402300799999  # the last millisecond of year 9999
    assert code_of(lambda: browse(_token(queue, last, last))) in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT)
    for partition, ms in ((0, 2**62), (2**62, 0), (-1, 0), (0, -(2**62))):
        refused(lambda: browse(_token(queue, partition, ms)), "a position no listing returns")


# ---------------------------------------------------------------- a tenant name with a line break
def test_a_tenant_quota_with_a_trailing_newline_is_refused(suite):
    quota = quotas_pb2.Quota(kind=quotas_pb2.QUOTA_KIND_TENANT, subject="acme\n", mails_per_s=5)
    refused(lambda: suite.admin_stub.SetQuota(admin_pb2.SetQuotaRequest(quota=quota)), "is not a tenant name")
    listed = suite.admin_stub.ListQuotas(admin_pb2.ListQuotasRequest()).quotas
    assert not any(q.subject.startswith("acme\n") for q in listed)


# ---------------------------------------------------------------- right already, now driven through gRPC
def test_out_of_range_fields_answered_right_but_never_driven_are_invalid_argument(suite):
    queue = suite.new_queue()
    config = suite.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration
    events = events_pb2_grpc.EventServiceStub(suite.browse.channel())
    week_and_a_second = shaping_pb2.ShapingRule(rule_id="r-long", pattern="421", threshold=3,
                                                action=shaping_pb2.SHAPING_ACTION_SUSPEND)
    week_and_a_second.window.FromSeconds(60)
    week_and_a_second.duration.FromSeconds(7 * 86400 + 1)

    def configured(**change):
        c = browse_pb2.ViewConfiguration()
        c.CopyFrom(config)
        for k, v in change.items():
            setattr(c, k, v)
        return admin_pb2.UpdateConfigurationRequest(configuration=c)

    calls = {
        "GetMailHistory name over 4096 bytes": lambda: events.GetMailHistory(events_pb2.GetMailHistoryRequest(name="n" * 4097)),
        "UpdateConfiguration bucket_count 0": lambda: suite.admin_stub.UpdateConfiguration(configured(bucket_count=0)),
        "UpdateConfiguration pace 0": lambda: suite.admin_stub.UpdateConfiguration(configured(update_browse_start_pace=0)),
        "Browse unknown schedule": lambda: list(suite.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, schedule=99))),
        "SetShapingRule duration over 7 days": lambda: suite.admin_stub.SetShapingRule(
            admin_pb2.SetShapingRuleRequest(rule=week_and_a_second)),
    }
    for what, call in calls.items():
        assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT, what
    assert suite.admin_stub.GetConfiguration(admin_pb2.GetConfigurationRequest()).configuration == config


def test_a_dequeue_stream_refuses_an_unknown_outcome_kind_and_a_second_subscribe(suite):
    from mailqueue.v1 import dequeue_pb2
    from stack.harness import wait_until
    from tests.integration.helpers import StreamConsumer, enqueue_names, message_count

    queue = suite.new_queue()
    enqueue_names(suite, queue, ["m"])
    for bad in (lambda d: dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=99)),
                lambda d: dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue))):
        c = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
        d = c.next()
        c.send(bad(d))
        with pytest.raises(EOFError):
            c.response(timeout=10)
        assert c.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        wait_until(lambda: message_count(queue) == 1, what="the delivery back in the queue, unsettled")
