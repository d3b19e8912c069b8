"""The docs' reference pages cover everything they are generated from or checked against: every RPC,
message, field and enum value of protos/ has its comment, every metric its help text, every mailq
command its help line, and every MAILQUEUE_* variable the code reads a row in the settings page.
A new RPC, metric, command or setting without documentation fails here (and `make docs` builds
the generated pages from the same functions: docs/hooks/reference.py)."""

import importlib.util
import os
import re
import sys

import pytest

from stack.harness import ROOT


def _load_reference():
    spec = importlib.util.spec_from_file_location("docs_reference", os.path.join(ROOT, "docs", "hooks", "reference.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ref = _load_reference()
SETTINGS_PAGE = os.path.join(ROOT, "docs", "pages", "reference", "settings.md")


@pytest.fixture(scope="module")
def proto_items():
    return ref.proto_items()


def test_every_service_rpc_and_message_is_on_the_api_page_with_its_comment(proto_items):
    # Given the generated API page
    page = ref.api_markdown()
    # Then every service, RPC, message and enum of protos/ is on it
    for item in proto_items:
        short = item.name.removeprefix("mailqueue.v1.")
        if item.kind == "rpc":
            assert f"| `{short.split('/')[1]}` |" in page, f"{item.name} is not on the API page"
        elif item.kind in ("service", "message", "enum"):
            assert f"### {short} " in page, f"{item.name} is not on the API page"
    # And each has a comment in its .proto
    undocumented = [f"{i.kind} {i.name}" for i in proto_items if not i.comment.strip()]
    assert not undocumented, "no comment in protos/ (write one above it): " + ", ".join(undocumented)


def test_every_rpc_of_the_stubs_is_described(proto_items):
    # The stubs the services run are generated from the same protos: none is missing from the page.
    from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2, events_pb2

    described = {i.name for i in proto_items if i.kind == "rpc"}
    for module in (admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2, events_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert f"{service.full_name}/{m.name}" in described


def _each_on_its_page(page: str, entries: list[tuple[str, str, str, str]]) -> None:
    """Each (what, the text that shows it on the page, its documentation, where to write it)."""
    for what, needle, text, where in entries:
        assert needle in page, f"{what} is not on its reference page"
        assert text.strip(), f"{what} has no documentation ({where})"


def test_every_metric_is_on_the_metrics_page_with_its_help():
    # Given every metric registered once the services' modules are imported
    metrics = ref.metrics()
    assert len(metrics) >= 30, [m.name for m in metrics]  # the import found them
    # Then each has a line, and a help text to put on it
    _each_on_its_page(ref.metrics_markdown(), [
        (m.name, f"| `{m.name}` |", m.documentation, "the second argument of its constructor") for m in metrics])


def test_every_mailq_command_and_subcommand_is_documented():
    commands = ref.commands()
    # Every command module's commands are found, subcommands included
    assert {"queues", "browse", "enqueue", "hold", "throttle set", "dead redrive"} <= {c.path for c in commands}
    _each_on_its_page(ref.cli_markdown(), [
        (f"mailq {c.path}", f"`mailq {c.path}`", c.help, "add_parser(..., help=...)") for c in commands])


def test_every_setting_the_code_reads_has_a_row():
    # Given every MAILQUEUE_* variable read from the environment in services/, spark/ and the services
    read = ref.settings_read()
    assert "MAILQUEUE_CASSANDRA_HOSTS" in read and "MAILQUEUE_SPARK_MASTER" in read  # the scan sees both kinds
    # When the settings page lists its rows
    with open(SETTINGS_PAGE) as f:
        rows = set(re.findall(r"^\| `(MAILQUEUE_[A-Z0-9_]+)` \|", f.read(), re.M))
    # Then each variable has one
    missing = sorted(set(read) - rows)
    assert not missing, "no row in docs/pages/reference/settings.md: " + ", ".join(f"{v} (read in {read[v]})" for v in missing)
    # And no row names a variable nothing reads
    stale = sorted(rows - set(read))
    assert not stale, "rows for variables no code reads: " + ", ".join(stale)


def test_the_settings_scan_sees_each_way_of_reading(tmp_path):
    # The helpers of services/runtime/settings.py, env.get, a module constant, os.environ[...]
    src = tmp_path / "services"
    src.mkdir()
    (src / "m.py").write_text(
        'import os\nX = "MAILQUEUE_FROM_CONSTANT"\n'
        'a = _int(env, "FROM_HELPER", 1)\nb = _credential(env, "f", "FROM_CREDENTIAL", None)\n'
        'c = env.get("MAILQUEUE_FROM_GET")\nd = os.environ.get(X)\ne = os.environ["MAILQUEUE_FROM_SUBSCRIPT"]\n'
        'f = env.get(f"MAILQUEUE_{name}")\n'
    )
    saved = ref.ROOT, ref.SETTINGS_SOURCES
    ref.ROOT, ref.SETTINGS_SOURCES = str(tmp_path), ("services",)
    try:
        found = set(ref.settings_read())
    finally:
        ref.ROOT, ref.SETTINGS_SOURCES = saved
    assert found == {"MAILQUEUE_FROM_CONSTANT", "MAILQUEUE_FROM_HELPER", "MAILQUEUE_FROM_CREDENTIAL",
                     "MAILQUEUE_FROM_GET", "MAILQUEUE_FROM_SUBSCRIPT"}
