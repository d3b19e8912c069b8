"""The benchmark charts (docs/hooks/charts.py): every chart a page asks for is in
bench/figures.json and every entry there is drawn somewhere; a drawing has a bar per figure."""

from __future__ import annotations

import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "hooks"))

import charts  # noqa: E402


def asked() -> set[str]:
    names = set()
    for path in glob.glob(os.path.join(ROOT, "docs", "pages", "**", "*.md"), recursive=True):
        with open(path, encoding="utf-8") as f:
            names |= set(charts.MARKER.findall(f.read()))
    return names


def test_every_chart_asked_for_is_recorded_and_every_record_is_drawn():
    assert asked() == set(charts.figures()), "bench/figures.json and the <!-- chart: --> lines differ"


def test_a_chart_has_a_bar_per_figure_and_writes_each_value():
    for name, chart in charts.figures().items():
        drawn = charts.render(f"<!-- chart: {name} -->", {name: chart})
        assert drawn.count("<rect ") == len(chart["bars"]), name
        for bar in chart["bars"]:
            assert f">{bar['value']:,g}<" in drawn and re.search(re.escape(bar["label"].replace("&", "&amp;")), drawn), (name, bar)


def test_a_chart_without_figures_fails_the_build():
    with pytest.raises(KeyError, match="no entry 'nowhere'"):
        charts.render("text\n<!-- chart: nowhere -->\n", {})
