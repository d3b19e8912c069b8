"""mailq: the operator CLI (think postqueue/postsuper, KumoMTA's kcli)."""


def entry() -> int:
    """The ``mailq`` command: Ctrl-C while the modules load (grpc's take a moment) ends quietly,
    with 130, like Ctrl-C later (mailq/cli.py ``main``)."""
    try:
        from mailq.cli import main
    except KeyboardInterrupt:
        return 130
    return main()
