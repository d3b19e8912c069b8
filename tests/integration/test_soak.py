"""The soak's short run (issue 47, item 7; the long one: ``python -m tests.soak --minutes N``).

It stops RabbitMQ and freezes Cassandra, so it runs with the outage tests, last (marker `outage`).
"""

import pytest

from tests.soak import soak

#: Beyond the suite's 300 s: a RabbitMQ stop and start took 91 s and 219 s on a loaded 2-core machine.
pytestmark = [pytest.mark.outage, pytest.mark.timeout(900)]

#: Seconds of traffic before the disturbances, and again after them.
PHASE_S = 20.0
#: Seconds of traffic after the recovery that are not measured: the backends' own warm-up after a
#: restart (every call in them is still judged).
SETTLE_S = 20.0
#: Measured from 20 s after the recovery, the rate after is the rate before (2026-11-27, 20 s phases,
#: a quiet 2-core machine: 19.7 answers/s before, 20.2 after, 1.02; the 9-minute soak: 0.92). Measured
#: from the recovery on, it caught the backends' own warm-up (0.29 to 0.44 on a loaded machine). The
#: short run allows half of the rate before (the issue's 20 % is `python -m tests.soak`'s bound): a
#: stall (230 calls/s down to 3) fails either way.
SHORT_RUN_TOLERANCE = 0.5


def test_every_call_is_answered_through_backend_restarts_and_certificate_renewals(running_stack):
    # Given one process of each service under enqueue/dequeue and browse/admin traffic
    # When its certificate is renewed, RabbitMQ stopped and started, Cassandra frozen and resumed,
    # and the certificate renewed again, the traffic going on
    # Then every call was answered within its deadline, no service logged an exception nobody
    # retrieved (nor a blocked loop), and the answer rate after is at least half the rate before
    faults = soak(PHASE_S, restarts=True, rate_tolerance=SHORT_RUN_TOLERANCE, settle_s=SETTLE_S)
    assert faults == [], "\n".join(faults)
