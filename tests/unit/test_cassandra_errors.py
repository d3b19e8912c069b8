"""Which Cassandra failures a client sees as UNAVAILABLE (retry) and which stay bugs."""

import types

import pytest
from cassandra import InvalidRequest, OperationTimedOut, Unauthorized, Unavailable
from cassandra.protocol import ErrorMessage

from services.adapters.cassandra import session
from services.adapters.cassandra.session import execute, unavailable
from services.domain.errors import BackendUnavailable
from tests.unit.aio import run


def server_error(code: int) -> ErrorMessage:
    return ErrorMessage(code, "from the server", {})


@pytest.mark.parametrize("error, retryable", [
    (server_error(0x1700), True),   # LWT result unknown: accepted by fewer replicas than a quorum
    (server_error(0x1001), True),   # overloaded
    (server_error(0x1002), True),   # bootstrapping
    (Unavailable("2 of 3 replicas down"), True),
    (OperationTimedOut("client timeout"), True),
    (server_error(0x2000), False),  # syntax error: a bug, never retried
    (server_error(0x2200), False),  # invalid query
    # InvalidRequest is a DriverException (an outage, but for this): a key over 64 KiB is a bug of
    # ours (an unchecked name), never "retry it"...
    (InvalidRequest("Key length of 70000 is longer than maximum of 65535"), False),
    # ... while a node that restarted under load answers for a while that a table does not exist
    (InvalidRequest("unconfigured table enqueued_mails_v1"), True),
    (InvalidRequest("Keyspace mailqueue_x doesn't exist"), True),
    # (a guard) answered also when a role's permissions cannot be read (too few replicas up): an outage
    (Unauthorized("Unable to perform authorization of permissions"), True),
    (ValueError("a bug of ours"), False),
])
def test_availability_errors_are_retryable_and_query_errors_are_not(error, retryable):
    assert unavailable(error) is retryable


def test_a_request_whose_answer_the_driver_loses_is_given_up_as_unavailable(monkeypatch):
    class Lost:  # a driver future that never calls back (a driver bug: no server makes it on demand)
        def add_callbacks(self, ok, err) -> None:
            pass

    class Driver:
        def execute_async(self, statement, params):
            return Lost()

        def get_execution_profile(self, name):
            return types.SimpleNamespace(request_timeout=0.05)

    monkeypatch.setattr(session, "LOST_ANSWER_GRACE_S", 0.05)
    with pytest.raises(BackendUnavailable, match="no answer from the driver within 0.1 s"):
        run(execute(Driver(), "SELECT release_version FROM system.local"))
