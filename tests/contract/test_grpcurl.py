"""The grpcurl page of the docs (docs/pages/reference/grpcurl.md) has a command for every RPC of
the contract. test_docs_blocks.py runs its block as pasted, with every other shell block of the docs."""

from pathlib import Path

from stack.harness import ROOT
from tests.contract.test_docs_blocks import shell_blocks

PAGE = Path(ROOT) / "docs" / "pages" / "reference" / "grpcurl.md"


def page_commands() -> str:
    """The page's grpcurl commands, as one text (the one block that runs)."""
    run, _ = shell_blocks(PAGE)
    return "\n".join(b.code for b in run)


def test_every_rpc_has_a_command():
    from mailqueue.v1 import admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2

    commands = page_commands().replace("\n", " ") + " "
    for module in (admin_pb2, blob_pb2, browse_pb2, dequeue_pb2, enqueue_pb2):  # every RPC of the contract
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert f"{service.full_name}/{m.name} " in commands, f"{service.full_name}/{m.name} has no grpcurl example"
