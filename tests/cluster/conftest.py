"""The cluster tier: the four services as processes against 3-node Cassandra and RabbitMQ clusters
(stack/stack.sh up --cluster), a keyspace of replication factor 3, quorum queues of 3 members."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc
from stack.harness import ServiceProcess, is_serving, new_keyspace, service_env, stack, wait_until
from tests.conftest import drop_keyspace


@pytest.fixture(scope="session")
def cluster_env() -> Iterator[dict[str, str]]:
    """The clusters up (started when they are down); the environment that points services at them.
    Clusters the tier started are stopped after it, as the Kubernetes tier's (left running after
    ``make test``, their nine nodes held about 4 GB of memory); clusters found running are left."""
    started = stack("status", "--cluster", check=False).returncode != 0
    try:
        if started:
            stack("up", "--cluster", timeout=840)
        env = {}
        for line in stack("cluster-env").stdout.splitlines():
            key, _, value = line.partition("=")
            env[key] = value
        yield env
    finally:
        if started:  # also after a start that failed half-way: down stops what up left
            stack("down", "--cluster", check=False, timeout=300)


def create_schema(env: dict[str, str]) -> None:
    """The keyspace's tables, created before the services start: after the fault tests a node
    that restarted may lag on schema agreement, and each table then costs the driver's 10 s wait
    for it, which would hold a service's start-up past its 60 s. Tables that exist are no change
    (no wait) when the services create them again."""
    from services.adapters.cassandra import schema
    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    settings = cassandra_from_env(env)
    cluster, session = connect(settings)
    try:
        schema.create(session, settings.keyspace, settings.replication)
    finally:
        cluster.shutdown()


class ClusterServices:
    """enqueue, dequeue, browse and blob as separate processes on the clusters."""

    def __init__(self, cluster_env: dict[str, str], **extra: str) -> None:
        self.keyspace = new_keyspace()
        # Counters gathered as in production (the other tiers write them at once to compare them).
        base = service_env(self.keyspace, **{"MAILQUEUE_COUNTER_FLUSH_S": "1", **cluster_env, **extra})
        # The single-node stack's variables must not leak in (a developer's shell may set them).
        base.pop("MAILQUEUE_RABBITMQ_URL", None)
        create_schema(base)
        self.blob = ServiceProcess("blob", base, metrics=True)
        env = {**base, "MAILQUEUE_BLOB_TARGET": self.blob.target}
        self.env = env
        self.enqueue = ServiceProcess("enqueue", env, metrics=True)
        self.dequeue = ServiceProcess("dequeue", env, metrics=True)
        self.browse = ServiceProcess("browse", env, metrics=True)
        self.all = {"enqueue": self.enqueue, "dequeue": self.dequeue, "browse": self.browse, "blob": self.blob}
        self.pids = {name: p.proc.pid for name, p in self.all.items()}
        self.admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(self.browse.target))

    def new_queue(self, within: float = 120) -> str:
        """A new queue, created as a client would: UNAVAILABLE ("retry it") is retried until the
        deadline. After the previous fault test the broker cluster may still be electing a quorum
        queue's leader (a node that was hung for 30 s rejoins), and declaring a queue waits on it."""
        name = f"q-{uuid.uuid4().hex[:10]}"
        request = admin_pb2.CreateQueueRequest(queue=name)

        def created() -> bool:
            try:
                self.admin.CreateQueue(request, timeout=30)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False
            return True

        wait_until(created, within, interval=1, what=f"CreateQueue {name} answered OK")
        return name

    def wait_serving(self, timeout: float = 120) -> float:
        """Seconds until the four services are SERVING again; asserts none was restarted."""
        start = time.monotonic()
        for name, p in self.all.items():
            wait_until(lambda p=p: is_serving(p.target), timeout, interval=0.2, what=f"{name}_svc SERVING")
            assert p.proc.poll() is None and p.proc.pid == self.pids[name], f"{name}_svc died or was restarted"
        return time.monotonic() - start

    def stop(self, drop: bool = False) -> None:
        for p in self.all.values():
            p.stop()
        if drop:
            drop_keyspace(self.keyspace, self.env)


@pytest.fixture(scope="module")
def services(cluster_env: dict[str, str]) -> ClusterServices:
    s = ClusterServices(cluster_env)
    yield s
    s.stop(drop=True)
