"""The layers of services/ hold (tests/layers.py reads the imports with ast)."""

from tests import layers


def test_no_import_circle_in_services_and_its_servicers():
    assert layers.circles(layers.graph()) == []


def test_no_import_runs_up_a_layer():
    assert layers.upward(layers.graph()) == []


def test_every_module_of_services_is_in_a_layer():
    outside = [m for m in layers.graph() if m not in layers.APART and layers.layer(m) == -1]
    assert outside == []


def test_the_checker_sees_a_circle_and_an_upward_import():
    g = {"services.domain.a": {"services.app.b"}, "services.app.b": {"services.domain.a"}}
    assert layers.circles(g) == [["services.app.b", "services.domain.a"]]
    assert layers.upward(g) == [("services.domain.a", "services.app.b")]
