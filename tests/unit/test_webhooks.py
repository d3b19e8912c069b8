"""What a webhook request carries and what an answer means (services/domain/webhooks.py): pure logic."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid

import pytest

from services.domain import events, model, webhooks
from services.domain.events import Actor, EventType, of_queue


@pytest.mark.parametrize("status, outcome", [
    (200, "delivered"), (204, "delivered"), (None, "retry"), (500, "retry"), (503, "retry"), (429, "retry"), (408, "retry"),
    (400, "refused"), (401, "refused"), (404, "refused"), (410, "refused"), (301, "retry"), (307, "retry"),
])
def test_what_an_answer_means(status, outcome):
    assert webhooks.verdict(status) == outcome


def test_the_backoff_doubles_up_to_its_cap():
    assert [webhooks.backoff_s(n, 0.5, 5) for n in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]
    # a dead endpoint's 1,025th failure in a row (about 17 h at a 60 s cap): 2 ** 1024 raised OverflowError
    assert webhooks.backoff_s(1025, 0.5, 60) == webhooks.backoff_s(10**9, 0.5, 60) == 60


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


def test_a_cloud_event_has_a_subject_only_when_it_is_a_mails():
    """CloudEvents 1.0: ``subject``, when present, is a non-empty string (a strict receiver refuses
    the batch otherwise, and a refused batch is not sent again)."""
    queue_event = webhooks.cloud_event(of_queue(EventType.QUEUE_CREATED, "q", "v1", actor=Actor.component("test")))
    assert "subject" not in queue_event
    t = model.utcnow()
    mail = model.QueuedMail("q", uuid.uuid4(), t, model.Mail("m.eml", "a@b.c", ("d@e.f",)), (), 0, t, 0)
    mail_event = webhooks.cloud_event(events.delivered(mail))
    assert mail_event["subject"] == str(mail.enqueue_id) == mail_event["data"]["enqueue_id"]


def test_a_secret_of_two_keys_signs_under_both_for_a_rotation():
    body, stamp = b'[{"id": "x"}]', 1_700_000_000
    one = webhooks.signature(b"old", stamp, body)
    both = webhooks.signature(b"new\nold\n", stamp, body)
    assert both.split(", ") == [webhooks.signature(b"new", stamp, body), one]  # the newest first
    assert one.startswith("sha256=") and ", " not in one  # one key: one signature, as before


def test_an_endpoint_that_hangs_holds_up_no_other_on_the_same_url_and_gets_no_queued_request():
    """Two endpoints on one URL: the first request trickles its answer. The other endpoint's request is answered
    at once (one lane per endpoint, not per URL), and a second request on the hung lane is not
    queued behind it (it would leave late, with a stale signed timestamp): no answer, at once."""
    import http.server
    import threading
    import time

    from services.adapters.http_poster import UrllibPoster
    from tests.unit.aio import run

    release, hung = threading.Event(), []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            if not hung:  # a byte at a time: each socket read is within urllib's timeout
                hung.append(self.headers["X-Lane"])
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                while not release.wait(0.05):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                return
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    poster = UrllibPoster()

    async def calls():
        first = await poster.post("a", url, b"[]", {"X-Lane": "a"}, 0.2)  # trickles: no answer by 0.4 s
        began = time.monotonic()
        again = await poster.post("a", url, b"[]", {"X-Lane": "a"}, 0.2)
        again_s = time.monotonic() - began
        other = await poster.post("b", url, b"[]", {"X-Lane": "b"}, 2)
        return first, again, again_s, other

    try:
        first, again, again_s, other = run(calls())
        assert hung == ["a"] and first.status is None
        assert again.status is None and again_s < 0.1  # not queued behind the hung one
        assert other.status == 200
    finally:
        release.set()
        server.shutdown()
