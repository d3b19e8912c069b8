"""The design lives in the repository (docs/pages/concepts/design.md), and the code's citations of it
("DESIGN §N", "§N.M") point to a section that exists; each invariant names a test that exists; no
file points to a path outside the repository."""

from __future__ import annotations

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "pages" / "concepts" / "design.md"
CITATION = re.compile(r"DESIGN (§[0-9.§\-–, ]+)")
SECTION = re.compile(r"§(\d+)(?:\.(\d+))?")


def tracked_text_files() -> list[pathlib.Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = []
    for name in names:
        path = ROOT / name
        if path.suffix in {".py", ".sh", ".proto", ".md", ".toml", ".yaml", ".yml", ".txt", ".json", ""} and path.is_file():
            out.append(path)
    return out


def sections() -> tuple[set[str], set[str]]:
    text = DESIGN.read_text()
    heads = set(re.findall(r"^## (\d+)\. ", text, re.M))
    items = set(re.findall(r"^\| (\d+\.\d+) \|", text, re.M))
    return heads, items


def test_every_design_citation_points_to_a_section_of_the_design_page():
    heads, items = sections()
    assert heads == {str(n) for n in range(1, 12)}, heads
    citations, missing = 0, []
    for path in tracked_text_files():
        if path == DESIGN:
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for cited in CITATION.findall(line):
                for major, minor in SECTION.findall(cited):
                    citations += 1
                    ok = major in heads and (not minor or f"{major}.{minor}" in items)
                    if not ok:
                        missing.append(f"{path.relative_to(ROOT)}:{lineno}: DESIGN §{major}{'.' + minor if minor else ''}")
    assert citations > 10  # the code does cite it
    assert missing == [], "citations of sections the design page lacks:\n" + "\n".join(missing)


def test_each_invariant_names_tests_that_exist():
    rows = [line for line in DESIGN.read_text().splitlines() if re.match(r"^\| 5\.\d+ \|", line)]
    assert len(rows) == 8
    for row in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", row)
        assert named, f"no test named in: {row}"
        for file, function in named:
            source = (ROOT / file).read_text()
            assert not function or re.search(rf"def {function}\(", source), f"{file} has no {function}"


def test_no_file_points_outside_the_repository():
    outside = re.compile(r"/work/|\.\./shared|shared/DESIGN|/root/")
    hits = []
    for path in tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line) and path.name != "test_design_references.py":
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:120]}")
    assert hits == [], "\n".join(hits)
