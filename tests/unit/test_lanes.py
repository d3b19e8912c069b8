"""make test-lanes' lanes (tests/lanes.py) run every test exactly once: each kind of test (its markers,
and whether it is one of the Spark sweep's) is selected by one step, and by one only."""

from __future__ import annotations

import pytest
from _pytest.mark.expression import Expression

from tests import lanes

#: The markers tests/conftest.py and the test files give (a test has any of these combinations).
KINDS = [set(), {"integration"}, {"integration", "outage"}, {"k8s"}, {"kubernetes"}, {"cluster"}]


def selects(step: lanes.Step, markers: set[str], path: str) -> bool:
    if "pytest" not in step.argv:
        return False
    argv = step.argv[step.argv.index("pytest") + 1:]  # pytest's own arguments
    expression = argv[argv.index("-m") + 1] if "-m" in argv else ""
    if expression and not Expression.compile(expression).evaluate(lambda name, **_: name in markers):
        return False
    if f"--ignore={path}" in argv:
        return False
    paths = [a for a in argv if a.startswith("tests/")]
    return not paths or path in paths


@pytest.mark.parametrize("markers, path", [(m, "tests/integration/test_enqueue.py") for m in KINDS]
                         + [(m, lanes.SWEEP_TESTS) for m in KINDS if "integration" in m])
def test_each_kind_of_test_runs_in_exactly_one_step(markers, path):
    steps = [f"{lane}: {s.name}" for lane, lane_steps in lanes.plan().items() for s in lane_steps if selects(s, markers, path)]
    assert len(steps) == 1, (markers, path, steps)


def test_the_steps_that_stop_a_backend_run_alone_and_last():
    plan = lanes.plan()
    assert list(plan) == ["main", "side", "alone"]
    assert [s.name for s in plan["alone"]] == ["outages", "Kubernetes tier"]
