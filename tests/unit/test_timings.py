"""tests.timings: a JUnit report read back by file and by tier."""

from tests.timings import by_file, main, tier

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>
  <testcase classname="tests.unit.test_a" name="test_two[x]" time="0.5"/>
  <testcase classname="tests.integration.test_b.TestGroup" name="test_three" time="120"/>
  <testcase classname="tests.cluster.test_c" name="test_four" time="60"><skipped/></testcase>
</testsuite></testsuites>
"""


def test_a_report_adds_up_by_file_and_by_tier(tmp_path, capsys):
    report = tmp_path / "r.xml"
    report.write_text(REPORT)
    assert by_file(report) == {"tests/unit/test_a.py": (2.0, 2), "tests/integration/test_b.py": (120.0, 1),
                               "tests/cluster/test_c.py": (60.0, 1)}
    assert [tier(f) for f in ("tests/unit/test_a.py", "tests/cluster/test_c.py", "bench/x.py")] == ["unit", "cluster", "other"]
    assert main([str(report)]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    assert ["integration", "2.0", "66%", "1"] in lines and ["all", "3.0", "4"] in lines


def test_no_report_says_how_to_get_one(tmp_path, capsys):
    assert main([str(tmp_path / "none.xml")]) == 2
    assert "run make test" in capsys.readouterr().err


def test_a_report_without_timed_tests_says_so(tmp_path, capsys):
    report = tmp_path / "empty.xml"
    report.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest"/></testsuites>')
    assert main([str(report)]) == 1
    assert "no timed tests" in capsys.readouterr().err
