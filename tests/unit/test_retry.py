"""The retry helper: delays, limits and what is retried (pure logic, no backend)."""

import pytest

from services.app.retry import retrying
from services.domain.backoff import Backoff
from tests.unit.aio import run


def test_delays_grow_by_the_multiplier_up_to_the_cap_within_the_jitter():
    b = Backoff("x", initial_s=0.5, multiplier=2, max_s=4, jitter=0.2)
    assert [b.delay(n, rand=lambda: 0.5) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.delay(1, rand=lambda: 0.0) == pytest.approx(0.4) and b.delay(1, rand=lambda: 1.0) == pytest.approx(0.6)


@pytest.mark.parametrize("kwargs", [dict(initial_s=-1), dict(multiplier=0.5), dict(initial_s=5, max_s=1),
                                    dict(jitter=1.0), dict(attempts=0)])
def test_a_nonsensical_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff("x", **{"initial_s": 0.1, **kwargs})


def _flaky(failures: int, error: type[BaseException]):
    calls = []

    async def op():
        calls.append(1)
        if len(calls) <= failures:
            raise error("down")
        return len(calls)

    return op, calls


def test_retries_the_named_errors_until_success_and_counts_them(caplog):
    op, calls = _flaky(3, ConnectionError)
    seen = []
    result = run(retrying(op, Backoff("probe", 0.0, max_s=0.0), (ConnectionError,), on_retry=seen.append))
    assert result == 4 and len(calls) == 4 and len(seen) == 3
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [f"probe failed [{n}/unlimited]" for n in (1, 2, 3)]


def test_gives_up_after_the_attempts_and_raises_the_last_error():
    op, calls = _flaky(5, ConnectionError)
    with pytest.raises(ConnectionError):
        run(retrying(op, Backoff("probe", 0.0, max_s=0.0, attempts=3), (ConnectionError,)))
    assert len(calls) == 3


def test_other_errors_are_not_retried():
    op, calls = _flaky(1, KeyError)
    with pytest.raises(KeyError):
        run(retrying(op, Backoff("probe", 0.0, max_s=0.0), (ConnectionError,)))
    assert len(calls) == 1
