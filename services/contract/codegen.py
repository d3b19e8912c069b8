"""The Python stubs of protos/: a protoc plugin for ``buf generate`` (buf.gen.yaml), and the same
generation without buf (``python -m services.contract.codegen --tree``, for the container image).

Generated code is not committed: protos/mailqueue/v1 is the only source of truth, and every
language generates from it with one template (buf.gen.yaml: Python here, Go and Node for the
contract clients in tests/contract).

As a plugin, it reads buf's CodeGeneratorRequest on stdin, has the protoc compiler embedded in
grpcio-tools write ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` from the request's descriptors
(no .proto is parsed twice), and answers with a CodeGeneratorResponse on stdout. grpcio-tools
ships no ``protoc-gen-grpc_python`` binary and pip no ``protoc``: this is the bridge.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import grpc_tools
from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]  # services/contract/codegen.py -> the repository
PROTO_DIR = ROOT / "protos"
OUTPUTS = ("--python_out", "--pyi_out", "--grpc_python_out")


def _protoc(inputs: list[str], files: list[str], out: pathlib.Path) -> None:
    args = ["grpc_tools.protoc", *inputs, *(f"{flag}={out}" for flag in OUTPUTS), *files]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: see the messages above (a .proto under protos/ does not compile)")


def plugin(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    """The Python files of the request's files to generate (packages get an ``__init__.py``)."""
    response = plugin_pb2.CodeGeneratorResponse(supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL)
    with tempfile.TemporaryDirectory() as tmp:
        descriptors = pathlib.Path(tmp) / "descriptors.pb"
        descriptors.write_bytes(_without_json_names(request.proto_file).SerializeToString())
        out = pathlib.Path(tmp) / "out"
        out.mkdir()
        try:
            _protoc([f"--descriptor_set_in={descriptors}"], list(request.file_to_generate), out)
        except RuntimeError as e:
            response.error = str(e)
            return response
        generated = sorted(p for p in out.rglob("*") if p.is_file())
        packages = {p.parent.relative_to(out) for p in generated}
        for package in sorted({q for p in packages for q in (p, *p.parents) if str(q) != "."}):
            response.file.add(name=str(package / "__init__.py"), content="")
        for p in generated:
            response.file.add(name=str(p.relative_to(out)), content=p.read_text())
    return response


def _without_json_names(files) -> descriptor_pb2.FileDescriptorSet:
    """The descriptors as protoc parses them for its own Python output: buf fills in every
    field's json_name, which the embedded descriptors would then carry, and reflection clients
    (grpcurl) would print camelCase field names instead of the proto names they print now."""
    out = descriptor_pb2.FileDescriptorSet(file=files)
    stack = [m for f in out.file for m in f.message_type]
    while stack:
        message = stack.pop()
        for field in (*message.field, *message.extension):
            field.ClearField("json_name")
        stack.extend(message.nested_type)
    return out


def generate_tree() -> None:
    """Without buf: the same files, from protos/ straight into the source tree."""
    files = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "mailqueue" / "v1").glob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    try:
        _protoc([f"-I{PROTO_DIR}", f"-I{well_known}"], files, ROOT)
    except RuntimeError as e:
        sys.exit(str(e))
    for pkg in (ROOT / "mailqueue", ROOT / "mailqueue" / "v1"):
        (pkg / "__init__.py").touch()
    print(f"[codegen] generated Python stubs for {len(files)} protos into {ROOT / 'mailqueue' / 'v1'}")


def main() -> None:
    if sys.argv[1:] == ["--tree"]:
        generate_tree()
        return
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(plugin(request).SerializeToString())


if __name__ == "__main__":
    main()
