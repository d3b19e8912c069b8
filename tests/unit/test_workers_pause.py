"""The supervisor's pause before starting a dead worker again (services/runtime/workers.py)."""

from services.runtime.workers import FIRST_PAUSE_S, LAST_PAUSE_S, STEADY_S, next_pause


def test_a_worker_that_keeps_dying_waits_longer_each_time_up_to_the_last_pause():
    pauses, last = [], None
    for _ in range(8):
        last = next_pause(last, ran_s=0.5)
        pauses.append(last)
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert (pauses[0], pauses[-1]) == (FIRST_PAUSE_S, LAST_PAUSE_S)


def test_a_steady_run_starts_the_pauses_over():
    assert next_pause(16.0, ran_s=STEADY_S) == FIRST_PAUSE_S
    assert next_pause(16.0, ran_s=STEADY_S - 0.1) == 30.0
