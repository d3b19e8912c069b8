"""Charts of the recorded benchmark figures, drawn when the site is built.

A page asks for one with a line ``<!-- chart: NAME -->``; this hook puts there an SVG bar chart
of ``bench/figures.json``'s entry NAME (its title, unit, bars and the command and date that
measured them). The figures live in one file beside the benches, the tables on the pages quote
them, and a chart cannot drift from its file. A name without an entry fails the build.
"""

from __future__ import annotations

import html
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = os.path.join(ROOT, "bench", "figures.json")
MARKER = re.compile(r"^<!-- chart: ([a-z0-9-]+) -->$", re.M)

WIDTH, LABEL_W, BAR_H, GAP, TOP = 720, 200, 22, 8, 52
COLORS = {"direct": "#9e9e9e", "service": "#3f51b5"}


def figures() -> dict:
    with open(FIGURES, encoding="utf-8") as f:
        return json.load(f)


def svg(chart: dict) -> str:
    """A horizontal bar chart: one bar per entry, its value written at its end."""
    bars = chart["bars"]
    top = max(b["value"] for b in bars) or 1
    span = WIDTH - LABEL_W - 90
    height = TOP + len(bars) * (BAR_H + GAP) + 8
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {WIDTH} {height}" '
           f'style="max-width:{WIDTH}px;width:100%;font:13px sans-serif">',
           f'<title>{html.escape(chart["title"])}</title>',
           f'<text x="0" y="16" font-weight="bold">{html.escape(chart["title"])}</text>',
           f'<text x="0" y="36" font-size="11" fill="#555">{html.escape(chart["unit"])}</text>']
    for i, b in enumerate(bars):
        y = TOP + i * (BAR_H + GAP)
        w = max(1.0, span * b["value"] / top)
        color = COLORS.get(b.get("kind", "service"), COLORS["service"])
        out.append(f'<text x="{LABEL_W - 8}" y="{y + BAR_H * 0.7:.1f}" text-anchor="end">{html.escape(b["label"])}</text>')
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{color}"/>')
        out.append(f'<text x="{LABEL_W + w + 6:.1f}" y="{y + BAR_H * 0.7:.1f}">{b["value"]:,g}</text>')
    out.append("</svg>")
    return "".join(out)


def render(markdown: str, charts: dict) -> str:
    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in charts:
            raise KeyError(f"<!-- chart: {name} -->: no entry {name!r} in bench/figures.json")
        c = charts[name]
        return f'<figure>\n{svg(c)}\n<figcaption>{html.escape(c["source"])}</figcaption>\n</figure>'

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    return render(markdown, figures()) if MARKER.search(markdown) else markdown
