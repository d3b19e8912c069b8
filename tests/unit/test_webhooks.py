"""What a webhook request carries and what an answer means (services/domain/webhooks.py): pure logic."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from services.domain import webhooks
from services.domain.events import Actor, EventType, of_queue


@pytest.mark.parametrize("status, outcome", [
    (200, "delivered"), (204, "delivered"), (None, "retry"), (500, "retry"), (503, "retry"), (429, "retry"), (408, "retry"),
    (400, "refused"), (401, "refused"), (404, "refused"), (410, "refused"), (301, "retry"), (307, "retry"),
])
def test_what_an_answer_means(status, outcome):
    assert webhooks.verdict(status) == outcome


def test_the_backoff_doubles_up_to_its_cap():
    assert [webhooks.backoff_s(n, 0.5, 5) for n in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]


def test_a_retry_after_is_honoured_up_to_an_hour():
    now = 1_700_000_000.0
    assert webhooks.retry_after_s("120", now) == 120 and webhooks.retry_after_s(None, now) is None
    assert webhooks.retry_after_s("Tue, 14 Nov 2023 22:15:00 GMT", now) == 100  # an HTTP date: 100 s after now
    assert webhooks.retry_after_s("soon", now) is None and webhooks.retry_after_s("-5", now) is None
    assert webhooks.retry_after_s("\u00b2", now) is None  # a digit to str.isdigit, not to float: it restarted the endpoint
    assert webhooks.backoff_s(1, 0.5, 60, asked_s=30) == 30  # asked for more than the backoff: waited
    assert webhooks.backoff_s(5, 0.5, 60, asked_s=1) == 8  # asked for less: the backoff still
    assert webhooks.backoff_s(1, 0.5, 60, asked_s=86400) == webhooks.MAX_RETRY_AFTER_S


def test_a_batch_is_signed_over_the_timestamp_and_the_body():
    e = of_queue(EventType.QUEUE_CREATED, "q", "v1", actor=Actor.component("test"))
    body = webhooks.batch_body([e])
    h = webhooks.headers(b"secret", 1700000000, body)
    assert h["Content-Type"] == "application/cloudevents-batch+json"
    assert h["Mailqueue-Signature"] == "sha256=" + hmac.new(b"secret", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert webhooks.signature(b"secret", 1700000001, body) != h["Mailqueue-Signature"]  # a replayed body with a new time fails
    (ce,) = json.loads(body)
    assert (ce["specversion"], ce["id"], ce["type"], ce["source"]) == ("1.0", e.id, "io.mailqueue.event.queue_created", "mailqueue/q")


def test_a_secret_of_two_keys_signs_under_both_for_a_rotation():
    body, stamp = b'[{"id": "x"}]', 1_700_000_000
    one = webhooks.signature(b"old", stamp, body)
    both = webhooks.signature(b"new\nold\n", stamp, body)
    assert both.split(", ") == [webhooks.signature(b"new", stamp, body), one]  # the newest first
    assert one.startswith("sha256=") and ", " not in one  # one key: one signature, as before
