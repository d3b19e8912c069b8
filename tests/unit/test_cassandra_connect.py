"""Connecting to Cassandra: a name that does not resolve (yet) is an outage to retry, never a crash."""

import socket

import pytest

from services.adapters.cassandra import session
from services.adapters.cassandra.settings import CassandraSettings
from services.domain.errors import BackendUnavailable


def test_a_host_name_that_does_not_resolve_is_unavailable_naming_the_variable(monkeypatch):
    # Given cluster DNS that does not answer yet (a pod started before it): every lookup fails
    def no_answer(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr("cassandra.cluster.socket.getaddrinfo", no_answer)
    # When the service connects, Then it is BackendUnavailable (retried, NOT_SERVING), not the driver's
    # UnresolvableContactPoints, which ended the process with exit 1 (a CrashLoopBackOff on Kubernetes)
    with pytest.raises(BackendUnavailable, match="no address for MAILQUEUE_CASSANDRA_HOSTS cassandra.mailqueue.svc"):
        session.connect(CassandraSettings(hosts=("cassandra.mailqueue.svc",)))
