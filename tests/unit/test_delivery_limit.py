"""When a RETRY must become a dead letter (services/app/subscription.py:retries_exhausted)."""

import pytest

from services.app.settlement import retries_exhausted


@pytest.mark.parametrize(("count", "limit", "exhausted"), [
    (0, 20, False),   # first delivery
    (19, 20, False),  # a requeue leaves the broker one more delivery
    (20, 20, True),   # a requeue now would be dead-lettered by the broker, unmarked
    (25, 20, True),   # a limit lowered on a live queue
    (1000, None, False),  # classic queues have no limit
])
def test_a_retry_is_dead_lettered_only_on_the_last_allowed_delivery(count, limit, exhausted):
    assert retries_exhausted(count, limit) is exhausted
