"""A process that cannot serve says so (issue 47, item 7): a blocked event loop is logged with
where it is stuck, and a backend check that never answers turns into NOT_SERVING's reason."""

import asyncio
import logging
import time

import pytest

from services.domain.errors import BackendUnavailable
from services.runtime import server
from services.runtime.watchdog import LoopWatchdog
from tests.unit.aio import run


def a_cpu_bound_walk(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_blocked_event_loop_is_logged_with_the_stack_that_blocks_it(caplog):
    async def scenario() -> None:
        watchdog = LoopWatchdog(asyncio.get_running_loop(), blocked_s=0.1)
        watchdog.start()
        try:
            await asyncio.sleep(0.3)  # turning: nothing to say
            a_cpu_bound_walk(0.6)  # the loop runs no callback meanwhile
            for _ in range(50):  # the watchdog's second line, once the loop turns again
                if any(r.msg == "event loop turns again" for r in caplog.records):
                    break
                await asyncio.sleep(0.02)
        finally:
            watchdog.stop()

    with caplog.at_level(logging.WARNING, logger="services.runtime.watchdog"):
        run(scenario())
    blocked = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(blocked) == 1, [r.msg for r in caplog.records]
    assert "a_cpu_bound_walk" in blocked[0].stack and blocked[0].blocked_s >= 0.1
    [again] = [r for r in caplog.records if r.msg == "event loop turns again"]
    assert again.blocked_s >= 0.5


def test_a_backend_check_that_never_answers_is_a_failure_with_its_reason(monkeypatch):
    class Stuck:
        name = "browse"

        async def check(self) -> None:
            await asyncio.Event().wait()  # a backend call that never returns

    monkeypatch.setattr(server, "CHECK_TIMEOUT_S", 0.1)
    with pytest.raises(BackendUnavailable, match="the backend check did not answer within 0.1 s"):
        run(server.checked(Stuck()))
