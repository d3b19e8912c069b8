"""The soak's short run (issue 47, item 7; the long one: ``python -m tests.soak --minutes N``).

It stops RabbitMQ and freezes Cassandra, so it runs with the outage tests, last (marker `outage`).
"""

import pytest

from tests.soak import soak

pytestmark = pytest.mark.outage

#: Seconds of traffic before the disturbances, and again after them.
PHASE_S = 20.0


def test_every_call_is_answered_through_backend_restarts_and_certificate_renewals(running_stack):
    # Given one process of each service under enqueue/dequeue and browse/admin traffic
    # When its certificate is renewed, RabbitMQ stopped and started, Cassandra frozen and resumed,
    # and the certificate renewed again, the traffic going on
    # Then every call was answered within its deadline, no service logged an exception nobody
    # retrieved (nor a blocked loop), and the answer rate after is within 20 % of the rate before
    faults = soak(PHASE_S, restarts=True)
    assert faults == [], "\n".join(faults)
