"""The grpcurl page of the docs (docs/pages/reference/grpcurl.md) has a command for every RPC of
the contract. test_docs_blocks.py runs its block as pasted, with every other shell block of the docs."""

import importlib
from pathlib import Path

from stack.harness import ROOT
from tests.contract.test_docs_blocks import shell_blocks

PAGE = Path(ROOT) / "docs" / "pages" / "reference" / "grpcurl.md"


def page_commands() -> str:
    """The page's grpcurl commands, as one text (the one block that runs)."""
    run, _ = shell_blocks(PAGE)
    return "\n".join(b.code for b in run)


def test_every_rpc_has_a_command():
    commands = page_commands().replace("\n", " ") + " "
    protos = sorted((Path(ROOT) / "protos" / "mailqueue" / "v1").glob("*.proto"))
    modules = [importlib.import_module(f"mailqueue.v1.{p.stem}_pb2") for p in protos]
    assert len(modules) >= 10
    for module in modules:  # every RPC of every .proto
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert f"{service.full_name}/{m.name} " in commands, f"{service.full_name}/{m.name} has no grpcurl example"
