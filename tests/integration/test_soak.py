"""The soak's short run (issue 47, item 7; the long one: ``python -m tests.soak --minutes N``).

It stops RabbitMQ and freezes Cassandra, so it runs with the outage tests, last (marker `outage`).
"""

import pytest

from tests.soak import soak

#: Beyond the suite's 300 s: a RabbitMQ stop and start took 91 s and 219 s on a loaded 2-core machine.
pytestmark = [pytest.mark.outage, pytest.mark.timeout(900)]

#: Seconds of traffic before the disturbances, and again after them.
PHASE_S = 20.0
#: In 20 s phases the rate after is measured while the services and backends still warm up again
#: (the runs of 2026-11-27 on a loaded 2-core machine: 0.29 and 0.41 of the rate before; the 9-minute
#: soak: 0.92). So this short run asserts that nothing stalls (the defect it guards against: 230 calls/s
#: down to 3, every call waiting for its deadline); the issue's 20 % bound is the long soak's,
#: `python -m tests.soak --minutes 9`, and is not met by the short run yet.
NO_STALL_TOLERANCE = 0.9


def test_every_call_is_answered_through_backend_restarts_and_certificate_renewals(running_stack):
    # Given one process of each service under enqueue/dequeue and browse/admin traffic
    # When its certificate is renewed, RabbitMQ stopped and started, Cassandra frozen and resumed,
    # and the certificate renewed again, the traffic going on
    # Then every call was answered within its deadline, no service logged an exception nobody
    # retrieved (nor a blocked loop), and the answer rate after is not a stall (a tenth of before at least)
    faults = soak(PHASE_S, restarts=True, rate_tolerance=NO_STALL_TOLERANCE)
    assert faults == [], "\n".join(faults)
