"""Which Cassandra failures a client sees as UNAVAILABLE (retry) and which stay bugs."""

import pytest
from cassandra import OperationTimedOut, Unavailable
from cassandra.protocol import ErrorMessage

from services.adapters.cassandra.session import unavailable


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
    (ValueError("a bug of ours"), False),
])
def test_availability_errors_are_retryable_and_query_errors_are_not(error, retryable):
    assert unavailable(error) is retryable
