"""The ``mailq`` command's entry point: Ctrl-C while the modules load (grpc's take a moment) ends
quietly, with 130, like Ctrl-C later (mailq/cli.py ``main``). A module of its own, loading nothing
until it runs: the package's other modules never import it."""

from __future__ import annotations


def main() -> int:
    try:
        from mailq.cli import main as run
    except KeyboardInterrupt:
        return 130
    return run()
