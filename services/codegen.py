"""Generate the Python gRPC stubs from protos/ (run by ``make proto``).

Generated code is not committed: protos/mailqueue/v1 is the only source of truth, and every
language (Python here, Go and Node in tests/contract) generates from it.
"""

from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc
import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT


def generate() -> None:
    files = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "mailqueue" / "v1").glob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={OUT_DIR}",
        f"--pyi_out={OUT_DIR}",
        f"--grpc_python_out={OUT_DIR}",
        *files,
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed: see the messages above (a .proto under protos/ does not compile)")
    for pkg in (OUT_DIR / "mailqueue", OUT_DIR / "mailqueue" / "v1"):
        (pkg / "__init__.py").touch()
    print(f"[codegen] generated Python stubs for {len(files)} protos into {OUT_DIR / 'mailqueue' / 'v1'}")


if __name__ == "__main__":
    generate()
