"""The delay ladder's routing (services/domain/delays.py): every delay waits exactly its units, never less."""

import datetime as dt
import re

import pytest

from services.domain import delays


def topic_matches(binding: str, key: str) -> bool:
    """RabbitMQ topic matching ('*' one word, '#' zero or more), for the bindings we declare."""
    pattern = re.escape(binding).replace(r"\*", r"[^.]+").replace(r"\.\#", r"(\.[^.]+)*").replace(r"\#", r"[^.]*(\.[^.]+)*")
    return re.fullmatch(pattern, key) is not None


def ride(n: int, queue: str) -> tuple[int, list[int]]:
    """Follow a message published with ``n`` units through the ladder's bindings: (units waited, levels)."""
    key = delays.routing_key(n, queue)
    waited, levels = 0, []
    for level in range(delays.entry_level(n), -1, -1):
        into_queue = topic_matches(delays.level_binding(level, "1"), key)
        onwards = topic_matches(delays.level_binding(level, "0"), key)
        assert into_queue != onwards  # exactly one route at every level
        if into_queue:
            waited += delays.ttl_ms(level) // 250
            levels.append(level)
    assert topic_matches(delays.delivery_binding(queue), key)
    return waited, levels


@pytest.mark.parametrize("n", [1, 2, 3, 5, 240, 14400, 126230400, 2**delays.LEVELS - 1])
def test_a_message_waits_exactly_its_units(n):
    waited, levels = ride(n, "q.with.dots")
    assert waited == n and len(levels) == bin(n).count("1")


def test_the_delivery_binding_does_not_match_another_queue_with_the_same_suffix():
    key = delays.routing_key(4, "a.demo")
    assert topic_matches(delays.delivery_binding("a.demo"), key)
    assert not topic_matches(delays.delivery_binding("demo"), key)


@pytest.mark.parametrize("delay,units", [
    (dt.timedelta(0), 0), (dt.timedelta(seconds=-5), 0), (dt.timedelta(milliseconds=1), 1),
    (dt.timedelta(milliseconds=250), 1), (dt.timedelta(milliseconds=251), 2), (dt.timedelta(days=366), 126489600),
])
def test_delays_round_up_to_whole_units(delay, units):
    assert delays.units(delay) == units


def test_the_ladder_holds_the_longest_allowed_delay_and_refuses_beyond_itself():
    assert delays.units(delays.MAX_DELAY) < 2**delays.LEVELS
    with pytest.raises(ValueError):
        delays.units(delays.UNIT * 2**delays.LEVELS)
