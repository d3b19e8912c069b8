"""The reference pages that are generated from their sources, so they cannot drift.

- ``reference/api.md``: every service, RPC, message, field and enum of ``protos/``, with the
  comments written above them, read from the descriptors that the project's pinned protoc
  (grpcio-tools) builds with ``--include_source_info``.
- ``reference/cli.md``: every ``mailq`` command and subcommand, from ``mailq.cli.parser()``.
- ``reference/metrics.md``: every metric in prometheus_client's registry once the service
  packages (``enqueue_svc``, ``dequeue_svc``, ``browse_svc``, ``blob_svc``) and every module of
  ``services`` are imported.

They are built by ``make docs`` (mkdocs runs this file as a hook: the pages exist only in the
built site, never in git) and read by ``tests/unit/test_docs_reference.py``, which fails when an
RPC, a message, a metric or a command has no documentation. The settings reference
(``docs/reference/settings.md``) is written by hand; the same test checks it against every
``MAILQUEUE_*`` variable the code reads (``settings_read()`` below).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # docs/hooks/ -> the repository
PROTO_DIR = os.path.join(ROOT, "protos")
MERMAID = os.path.join(ROOT, "docs", "node_modules", "mermaid", "dist", "mermaid.min.js")
#: The generated pages: path in the site -> the function that writes it.
PAGES = {}


def page(path):
    def register(fn):
        PAGES[path] = fn
        return fn
    return register


def _cell(text: str) -> str:
    """One line of a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _para(text: str) -> str:
    """A comment as paragraphs: lines joined, blank lines kept."""
    return "\n\n".join(" ".join(p.split()) for p in text.strip().split("\n\n") if p.strip())


# --- protos ------------------------------------------------------------------------------------

def proto_files() -> list[str]:
    folder = os.path.join(PROTO_DIR, "mailqueue", "v1")
    return sorted(f"mailqueue/v1/{f}" for f in os.listdir(folder) if f.endswith(".proto"))


def descriptor_set():
    """The FileDescriptorSet of protos/, with source info (the comments)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.binpb")
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", "--include_source_info",
                          f"--descriptor_set_out={out}", *proto_files()])
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}) on {PROTO_DIR}")
        fds = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            fds.ParseFromString(f.read())
    return fds


@dataclass
class ProtoItem:
    kind: str  # service, rpc, message, field, enum, value
    name: str  # full name (mailqueue.v1.EnqueueService/Enqueue for an RPC)
    comment: str
    detail: str = ""


def _comments(fd) -> dict[tuple[int, ...], str]:
    return {tuple(loc.path): loc.leading_comments for loc in fd.source_code_info.location}


def proto_items(fds=None) -> list[ProtoItem]:
    """Every service, RPC, message (nested too), field, enum and enum value, with its comment."""
    fds = fds or descriptor_set()
    items: list[ProtoItem] = []
    for fd in fds.file:
        if not fd.name.startswith("mailqueue/"):
            continue
        c = _comments(fd)
        pkg = fd.package

        def enum(e, path, prefix):
            full = f"{prefix}.{e.name}"
            items.append(ProtoItem("enum", full, c.get(path, ""), fd.name))
            for i, v in enumerate(e.value):
                items.append(ProtoItem("value", f"{full}.{v.name}", c.get(path + (2, i), ""), str(v.number)))

        def message(m, path, prefix):
            full = f"{prefix}.{m.name}"
            items.append(ProtoItem("message", full, c.get(path, ""), fd.name))
            for i, f in enumerate(m.field):
                label = "repeated " if f.label == f.LABEL_REPEATED else ""
                typ = f.type_name.lstrip(".") if f.type_name else f.Type.Name(f.type)[5:].lower()
                oneof = f" (oneof {m.oneof_decl[f.oneof_index].name})" if f.HasField("oneof_index") and not f.proto3_optional else ""
                items.append(ProtoItem("field", f"{full}.{f.name}", c.get(path + (2, i), ""), f"{label}{typ}{oneof} = {f.number}"))
            for i, n in enumerate(m.nested_type):
                if not n.options.map_entry:
                    message(n, path + (3, i), full)
            for i, e in enumerate(m.enum_type):
                enum(e, path + (4, i), full)

        for i, s in enumerate(fd.service):
            items.append(ProtoItem("service", f"{pkg}.{s.name}", c.get((6, i), ""), fd.name))
            for j, r in enumerate(s.method):
                stream_in = "stream " if r.client_streaming else ""
                stream_out = "stream " if r.server_streaming else ""
                sig = f"({stream_in}{r.input_type.lstrip('.')}) returns ({stream_out}{r.output_type.lstrip('.')})"
                items.append(ProtoItem("rpc", f"{pkg}.{s.name}/{r.name}", c.get((6, i, 2, j), ""), sig))
        for i, m in enumerate(fd.message_type):
            message(m, (4, i), pkg)
        for i, e in enumerate(fd.enum_type):
            enum(e, (5, i), pkg)
    return items


def _anchor(full: str) -> str:
    return full.replace(".", "-").replace("/", "-").lower()


def _type_link(typ: str, known: set[str]) -> str:
    base = typ.split(" (")[0].split(" = ")[0].removeprefix("repeated ")
    if base in known:
        return typ.replace(base, f"[`{base.rsplit('.', 1)[-1]}`](#{_anchor(base)})", 1)
    return f"`{typ}`" if " " not in typ else typ.replace(base, f"`{base}`", 1)


@page("reference/api.md")
def api_markdown() -> str:
    items = proto_items()
    known = {i.name for i in items if i.kind in ("message", "enum")}
    out = ["# gRPC API", "",
           "Generated by `make docs` from the comments in `protos/mailqueue/v1/` (the only source of the "
           "contract): every service, RPC, message, field and enum. Clients in any language generate their "
           "stubs from the same files; [every RPC from a shell](grpcurl.md) shows each one called.", ""]
    files = sorted({i.detail for i in items if i.kind in ("service", "message", "enum") and i.detail.endswith(".proto")})
    for fname in files:
        out += [f"## `{fname}`", ""]
        owned = [i for i in items if i.kind in ("service", "message", "enum") and i.detail == fname]
        for top in owned:
            out += [f"### {top.name.removeprefix('mailqueue.v1.')} {{#{_anchor(top.name)}}}", "", f"*{top.kind}*", ""]
            if top.comment.strip():
                out += [_para(top.comment), ""]
            if top.kind == "service":
                out += ["| RPC | request → response | description |", "|---|---|---|"]
                for r in (i for i in items if i.kind == "rpc" and i.name.startswith(top.name + "/")):
                    req, resp = r.detail[1:].split(") returns (")
                    resp = resp[:-1]
                    out.append(f"| `{r.name.split('/')[1]}` | {_type_link(req, known)} → {_type_link(resp, known)} | {_cell(r.comment)} |")
            elif top.kind == "message":
                fields = [i for i in items if i.kind == "field" and i.name.rsplit(".", 1)[0] == top.name]
                if fields:
                    out += ["| field | type | description |", "|---|---|---|"]
                    for f in fields:
                        out.append(f"| `{f.name.rsplit('.', 1)[1]}` | {_type_link(f.detail, known)} | {_cell(f.comment)} |")
                else:
                    out.append("No fields.")
            else:
                out += ["| value | number | description |", "|---|---|---|"]
                for v in (i for i in items if i.kind == "value" and i.name.rsplit(".", 1)[0] == top.name):
                    out.append(f"| `{v.name.rsplit('.', 1)[1]}` | {v.detail} | {_cell(v.comment)} |")
            out.append("")
    return "\n".join(out)


# --- metrics -----------------------------------------------------------------------------------

SERVICE_PACKAGES = ("enqueue_svc", "dequeue_svc", "browse_svc", "blob_svc")


def import_services() -> None:
    for name in SERVICE_PACKAGES:
        importlib.import_module(f"{name}.app")
    import services

    for mod in pkgutil.walk_packages(services.__path__, "services."):
        importlib.import_module(mod.name)


@dataclass
class Metric:
    name: str  # as exposed (a counter's _total included)
    type: str
    documentation: str
    labels: tuple[str, ...]


def metrics() -> list[Metric]:
    """Every mailqueue_* metric registered once the service modules are imported."""
    import_services()
    from prometheus_client import REGISTRY

    found = {}
    for collector, names in list(REGISTRY._collector_to_names.items()):
        describe = getattr(collector, "describe", None) or collector.collect
        labels = tuple(getattr(collector, "_labelnames", ()))
        for fam in describe():
            if not fam.name.startswith("mailqueue_"):
                continue
            exposed = fam.name + "_total" if fam.type == "counter" else fam.name
            found[exposed] = Metric(exposed, fam.type, fam.documentation, labels)
    return [found[k] for k in sorted(found)]


@page("reference/metrics.md")
def metrics_markdown() -> str:
    out = ["# Metrics", "",
           "Generated by `make docs` from prometheus_client's registry after importing the four services "
           "and every module of `services/`: each service exposes the metrics of the code it runs on its "
           "metrics port (`/metrics`, port + 1000 by default). Histograms also expose `_bucket`, `_sum` "
           "and `_count`. How to watch them: [dashboards and alerts](../operating/dashboards.md).", "",
           "| metric | type | labels | description |", "|---|---|---|---|"]
    for m in metrics():
        labels = ", ".join(f"`{label}`" for label in m.labels) or "–"
        out.append(f"| `{m.name}` | {m.type} | {labels} | {_cell(m.documentation)} |")
    return "\n".join(out) + "\n"


# --- mailq -------------------------------------------------------------------------------------

@dataclass
class Command:
    path: str  # "throttle set"
    help: str
    usage: str
    options: list[tuple[str, str]]


def _subparsers(p: argparse.ArgumentParser):
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                yield name, helps.get(name, ""), sub


def commands() -> list[Command]:
    """Every mailq command and subcommand, in the parser's order."""
    from mailq.cli import parser

    out: list[Command] = []

    def walk(p, prefix):
        for name, help_, sub in _subparsers(p):
            path = f"{prefix} {name}".strip()
            opts = []
            for a in sub._actions:
                if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                flags = ", ".join(a.option_strings) or (a.metavar or a.dest)
                opts.append((flags, a.help or ""))
            usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
            out.append(Command(path, help_ or (sub.description or ""), usage, opts))
            walk(sub, path)

    walk(parser(), "")
    return out


@page("reference/cli.md")
def cli_markdown() -> str:
    from mailq.cli import parser

    p = parser()
    out = ["# `mailq` commands", "",
           "Generated by `make docs` from `mailq.cli.parser()` (each module of `mailq/` registers its own "
           "commands). For the same commands grouped by task, see [operating with mailq](../operating/mailq.md).", "",
           "## Global options", "", "| option | description |", "|---|---|"]
    for a in p._actions:
        if a.option_strings and not isinstance(a, argparse._HelpAction):
            out.append(f"| `{', '.join(a.option_strings)}` | {_cell(a.help or '')} |")
    out += ["", "## Output and exit status", "", "```text", p.epilog.strip(), "```", ""]
    for c in commands():
        depth = "##" if " " not in c.path else "###"
        out += [f"{depth} `mailq {c.path}`", "", _cell(c.help) or "", "", "```text", c.usage, "```", ""]
        if c.options:
            out += ["| argument | description |", "|---|---|"]
            out += [f"| `{flags}` | {_cell(h)} |" for flags, h in c.options]
            out.append("")
    return "\n".join(out)


# --- settings (checked, not generated) ---------------------------------------------------------

#: Helpers of services/runtime/settings.py that read MAILQUEUE_<name>: the index of <name>.
_HELPERS = {"_get": 1, "_int": 1, "_float": 1, "_file": 1, "_ca_file": 1, "_optional_int": 1, "_bool": 1, "_credential": 2}
#: Where settings are read: services/runtime/settings.py and the few places its docstring names.
SETTINGS_SOURCES = ("services", "spark", "enqueue_svc", "dequeue_svc", "browse_svc", "blob_svc", "webhook_svc")


def settings_read() -> dict[str, str]:
    """Every MAILQUEUE_* variable the code reads from the environment -> the first file reading it."""
    found: dict[str, str] = {}
    for top in SETTINGS_SOURCES:
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for fname in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(folder, fname)
                tree = ast.parse(open(path).read(), path)
                consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                          for t in n.targets if isinstance(t, ast.Name)}
                rel = os.path.relpath(path, ROOT)
                for node in ast.walk(tree):
                    names_read = []
                    if isinstance(node, ast.Call):
                        fn = node.func
                        fname_ = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                        if fname_ in _HELPERS and len(node.args) > _HELPERS[fname_]:
                            arg = node.args[_HELPERS[fname_]]
                            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                                names_read.append("MAILQUEUE_" + arg.value)
                        elif fname_ in ("get", "getenv", "env") and node.args:
                            arg = node.args[0]
                            value = arg.value if isinstance(arg, ast.Constant) else consts.get(arg.id) if isinstance(arg, ast.Name) else None
                            if isinstance(value, str):
                                names_read.append(value)
                    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                        if ast.unparse(node.value).endswith("environ"):
                            names_read.append(node.slice.value)
                    for n in names_read:
                        if isinstance(n, str) and n.startswith("MAILQUEUE_") and n.rstrip("_") == n:
                            found.setdefault(n, rel)
            for fname in sorted(n for n in names if n.endswith(".sh")):  # a script's ${MAILQUEUE_X:-default}
                path = os.path.join(folder, fname)
                for n in re.findall(r"\$\{(MAILQUEUE_[A-Z0-9_]*[A-Z0-9])", open(path).read()):
                    found.setdefault(n, os.path.relpath(path, ROOT))
    return dict(sorted(found.items()))


# --- mkdocs hooks ------------------------------------------------------------------------------

def on_files(files, config):
    """Add the generated pages and the local Mermaid to the site (nothing is written in docs/)."""
    from mkdocs.structure.files import File

    # The pages describe this checkout's code, whatever the working directory or an editable install
    # elsewhere (mkdocs restores sys.path after loading a hook, so this is done here).
    if sys.path[:1] != [ROOT]:
        sys.path.insert(0, ROOT)
    for path, fn in PAGES.items():
        files.append(File.generated(config, path, content=fn()))
    if not os.path.isfile(MERMAID):
        raise SystemExit(f"{MERMAID} is missing: run `make docs` (npm ci in docs/)")
    files.append(File.generated(config, "assets/javascripts/mermaid.min.js", abs_src_path=MERMAID))
    return files


if __name__ == "__main__":  # python docs/hooks/reference.py OUTDIR: the pages as files, to read
    sys.path.insert(0, ROOT)
    target = sys.argv[1] if len(sys.argv) > 1 else "."
    for path, fn in PAGES.items():
        os.makedirs(os.path.dirname(os.path.join(target, path)), exist_ok=True)
        with open(os.path.join(target, path), "w") as f:
            f.write(fn())
    subprocess.run(["ls", "-R", target], check=False)
