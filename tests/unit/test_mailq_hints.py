"""What mailq tells an operator to do about a failed call (mailq/cli.py ``hint``): pure logic."""

import grpc
import pytest

from mailq.cli import SERVED_UNAVAILABLE_HINT, hint

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("details", [
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
    "DNS resolution failed for mq.example.invalid:50051: C-ares status is not ARES_SUCCESS",
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:50051: Ssl handshake failed",
    "Socket closed",
    "",
])
def test_no_connection_asks_whether_the_service_is_up_and_for_its_ca(details):
    said = hint(UNAVAILABLE, "queues", details)
    assert "is the service up" in said and "--tls-ca" in said


@pytest.mark.parametrize("details", [
    "rabbitmq unavailable: (406, 'PRECONDITION_FAILED'); the request was not applied, retry it",
    "cassandra unavailable: NoHostAvailable; the request was not applied, retry it",
    "RabbitMQ blocks publishers, low on disk: the mail was not enqueued; retry it once the alarm is cleared",
    "dequeue_svc is stopping: subscribe again",
])
def test_a_service_that_answered_unavailable_is_not_sent_to_check_its_address(details):
    said = hint(UNAVAILABLE, "enqueue", details)
    assert said == SERVED_UNAVAILABLE_HINT and "--tls-ca" not in said


def test_other_codes_keep_their_hints():
    assert "mailq queues" in hint(grpc.StatusCode.NOT_FOUND, "show", "no queue 'x'")
    assert "mailq webhook list" in hint(grpc.StatusCode.NOT_FOUND, "webhook", "no webhook named 'x'")
