"""mailq: the operator CLI (think postqueue/postsuper, KumoMTA's kcli)."""

