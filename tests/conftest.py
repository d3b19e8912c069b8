"""Shared fixtures. Tests are marked by folder: tests/integration and tests/contract `integration`
(they need the stack, and the contract tests the services and the Go/Node clients: make contract),
tests/cluster `cluster`, tests/kubernetes `kubernetes` but for tests/kubernetes/manifests, `k8s`."""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import queue as queue_mod
import threading
import uuid

import grpc
import pytest

from mailqueue.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    blob_pb2_grpc,
    browse_pb2,
    browse_pb2_grpc,
    dequeue_pb2_grpc,
    enqueue_pb2,
    enqueue_pb2_grpc,
    mail_pb2,
)
from services.runtime.interceptors import ErrorsAndMetrics
from stack.harness import (
    ServiceProcess,
    credentials_dir,
    drop_keyspace,
    drop_queues,
    new_keyspace,
    service_env,
    stack,
    stack_env,
    stack_whole,
)
from tests.inprocess import LoopThread, RunningApp

#: The last lines of the output: each failure's last frames and the machine's state then.
pytest_plugins = ["tests.digest"]

INTEGRATION = pathlib.Path(__file__).parent / "integration"
CONTRACT = pathlib.Path(__file__).parent / "contract"
CLUSTER = pathlib.Path(__file__).parent / "cluster"
SPARK_CLUSTER_TEST = CLUSTER / "test_spark_cluster.py"
#: The Kubernetes tests: the real cluster tier (marker ``kubernetes``), but for ``manifests/``,
#: the offline checks of the manifests (marker ``k8s``: kustomize and the schemas, no cluster).
KUBERNETES = pathlib.Path(__file__).parent / "kubernetes"
MANIFESTS = KUBERNETES / "manifests"


def _extend_timeout(item: pytest.Item, default: float, extra: float) -> None:
    """The item's own timeout (or the default) plus ``extra`` seconds: a tier's set-up in its first test."""
    own = item.get_closest_marker("timeout")
    limit = float(own.args[0]) if own and own.args else default
    item.add_marker(pytest.mark.timeout(limit + extra), append=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default = float(config.getini("timeout") or 300)
    for item in items:
        parents = pathlib.Path(str(item.fspath)).parents
        if INTEGRATION in parents or CONTRACT in parents:
            item.add_marker(pytest.mark.integration)
        if CLUSTER in parents:
            item.add_marker(pytest.mark.cluster)
            # The first cluster test also starts the clusters (stack.sh up --cluster: 288 s here,
            # over 300 s on CI's machine): each cluster test gets 600 s more than its own limit, so
            # the set-up is bounded by its own waits (the fixture's subprocess timeout).
            _extend_timeout(item, default, 600)
        if MANIFESTS in parents:
            item.add_marker(pytest.mark.k8s)
        elif KUBERNETES in parents:
            item.add_marker(pytest.mark.kubernetes)
            # The first test of the tier also starts the cluster when it is down (stack/kube/kube.sh
            # up: about 100 s warm) and applies the overlay: 300 s more than each test's own limit.
            _extend_timeout(item, default, 300)
    # Tests that stop a backend run last, so an outage never overlaps another test; then the
    # Kubernetes tier (it stops the broker too), then the cluster tier (its own nodes, faults of
    # its own): in it, the Spark standalone sweep first, on clusters no fault has touched yet (after
    # the node kills, a restarted node's lagging schema agreement and catch-up made it 305-425 s,
    # against 44 s on quiet clusters).
    items.sort(key=lambda item: (item.get_closest_marker("cluster") is not None,
                                 item.get_closest_marker("kubernetes") is not None,
                                 item.get_closest_marker("outage") is not None,
                                 pathlib.Path(str(item.fspath)) not in (SPARK_CLUSTER_TEST,)))


@pytest.fixture(scope="session")
def running_stack() -> None:
    """The real Cassandra, RabbitMQ and MinIO; started by stack/stack.sh when they are down, or
    provisioned again when a role has no credential yet (a stack made before the role existed)."""
    import os

    from stack.provision import ROLES

    unprovisioned = [r for r in ROLES if not os.path.isdir(credentials_dir(r))]
    if unprovisioned or stack("status", check=False).returncode != 0:
        result = stack("up", check=False)
        if result.returncode != 0:
            pytest.fail(f"stack/stack.sh up failed:\n{result.stderr[-3000:]}")
    # The tests reach the backends as the operator, over TLS; each service they start runs with
    # its own credential (harness.as_service).
    os.environ.update(stack_env("operator"))


@pytest.fixture(scope="session")
def aio_loop() -> LoopThread:
    loop = LoopThread()
    yield loop
    loop.stop()


@pytest.fixture(scope="session")
def keyspace(running_stack: None) -> str:
    """A keyspace of this test session's own: tests never see dev data or each other's."""
    name = new_keyspace()
    yield name
    drop_keyspace(name)


# pytest-grpc: its grpc_add_to_server / grpc_servicer / grpc_stub_cls fixtures drive an in-process
# server. Our servicers are asyncio ones, so the server it starts is a grpc.aio server on our loop.
@pytest.fixture(scope="module")
def grpc_server(grpc_addr, grpc_add_to_server, grpc_servicer, aio_loop):
    async def start() -> grpc.aio.Server:
        server = grpc.aio.server(interceptors=[ErrorsAndMetrics()])
        grpc_add_to_server(grpc_servicer, server)
        server.add_insecure_port(grpc_addr)
        await server.start()
        return server

    server = aio_loop.run(start())
    yield server
    aio_loop.run(server.stop(None))


#: RabbitMQ queues the current test created (Suite.new_queue); removed after each test, so that
#: hundreds of idle quorum queues never slow the broker (and its restarts) down for later tests.
CREATED_QUEUES: list[str] = []


def own_queue(prefix: str) -> str:
    """A queue name of the current test's own (``prefix-`` and 8 hex digits), its RabbitMQ queues
    removed after the test like Suite.new_queue's."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    CREATED_QUEUES.append(name)
    return name


class _Dropper:
    """Removes each test's RabbitMQ queues in a thread of its own while the next test runs (a
    removal is a TLS connection and a quorum queue delete per class: about 0.3 s a test). A test
    that stops a backend, or the Kubernetes and cluster tiers, first waits for it to be idle: an
    outage never overlaps a removal (its queues would be left, and slow the broker's restarts)."""

    def __init__(self) -> None:
        self._batches: queue_mod.Queue[tuple[list[str], dict[str, str]] | None] = queue_mod.Queue()
        self._thread: threading.Thread | None = None
        #: Removals that failed otherwise than on a stopped broker, shown at the end of the session.
        self.failures: list[str] = []

    def drop(self, names: list[str]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drop-created-queues", daemon=True)
            self._thread.start()
        self._batches.put((names, dict(os.environ)))  # the broker the test used, not the next one's

    def _run(self) -> None:
        import pika

        while (batch := self._batches.get()) is not None:
            names, env = batch
            try:
                drop_queues(names, env)  # every class's work queue, the dead-letter queue, the exchanges
            except (pika.exceptions.AMQPError, OSError):
                pass  # a test that stopped the broker: its queues stay
            except Exception as e:  # noqa: BLE001 - the thread goes on with the next test's queues
                self.failures.append(f"{names}: {e!r}")
            finally:
                self._batches.task_done()
        self._batches.task_done()

    def wait_idle(self) -> None:
        if self._thread is not None:
            self._batches.join()

    def close(self) -> None:
        if self._thread is not None:
            self._batches.put(None)
            self._thread.join(120)
        if self.failures:
            print(f"\n[tests] RabbitMQ queues not removed after {len(self.failures)} test(s): {self.failures[:3]}")


_DROPPER = _Dropper()


@pytest.fixture(scope="session", autouse=True)
def _dropped_at_the_end():
    yield
    _DROPPER.close()


@pytest.fixture(autouse=True)
def _drop_created_queues(request: pytest.FixtureRequest):
    if any(request.node.get_closest_marker(m) for m in ("outage", "kubernetes", "cluster")):
        _DROPPER.wait_idle()
    yield
    if CREATED_QUEUES:
        _DROPPER.drop(list(CREATED_QUEUES))
        CREATED_QUEUES.clear()


#: Set on a test whose set-up or call failed (below): its clean-up may not have run to the end.
FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    if outcome.get_result().failed:
        item.stash[FAILED] = True


@pytest.fixture(autouse=True)
def _stack_whole_after_a_failed_outage(request: pytest.FixtureRequest):
    """A test that stops a backend and failed (or timed out) half-way may leave it stopped, and
    every test after it would fail for that. The stack is checked after such a test and started
    again where a component is down (stack.sh up starts a stopped RabbitMQ app too)."""
    yield
    if not request.node.stash.get(FAILED, False):
        return
    if not any(request.node.get_closest_marker(m) for m in ("outage", "kubernetes")):
        return
    stack_whole(f"after the failed {request.node.name}")


class BaseSuite:
    """The four services of one keyspace as a client sees them: stubs, a View of the same
    keyspace for reading what they wrote, and their metrics. Subclasses run the services."""

    loop: LoopThread
    keyspace: str

    def _connect(self) -> None:
        self.enqueue_stub = enqueue_pb2_grpc.EnqueueServiceStub(self.enqueue.channel())
        self.blob_stub = blob_pb2_grpc.BlobServiceStub(self.blob.channel())
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self.browse.channel())
        self.browse_stub = browse_pb2_grpc.BrowseServiceStub(self.browse.channel())
        self.dequeue_stub = dequeue_pb2_grpc.DequeueServiceStub(self.dequeue.channel())

    def run(self, coro, timeout: float = 60):
        return self.loop.run(coro, timeout)

    def new_queue(self, **policy: float) -> str:
        """A new queue; ``policy``: retry policy fields (durations in seconds)."""
        from mailqueue.v1 import browse_pb2

        name = f"q-{uuid.uuid4().hex[:10]}"
        p = browse_pb2.RetryPolicy()
        for field, value in policy.items():
            if field in ("initial_backoff", "max_backoff", "max_age"):
                getattr(p, field).FromTimedelta(dt.timedelta(seconds=value))
            else:
                setattr(p, field, value)
        request = admin_pb2.CreateQueueRequest(queue=name, retry_policy=p if policy else None)
        assert self.admin_stub.CreateQueue(request).created
        CREATED_QUEUES.append(name)
        return name

    def metric(self, service: str, name: str, **labels: str) -> float:
        """The sum of a Prometheus sample's values, over the samples whose labels include ``labels``."""
        raise NotImplementedError

    # What a client reads and writes through the API, typed: the tests call these rather than
    # wrappers of their own. (``self.enqueue`` and ``self.browse`` are the services themselves.)

    def enqueue_receipt(self, request: enqueue_pb2.EnqueueRequest) -> enqueue_pb2.Receipt:
        """Enqueue: the receipt of the stored mail."""
        return self.enqueue_stub.Enqueue(request).receipt

    def enqueue_mail(self, queue: str, name: str, content: bytes | None = None,
                     recipients: tuple[str, ...] | None = None) -> enqueue_pb2.Receipt:
        """Enqueue a mail named ``name`` with inline ``content`` (helpers.inline's default when
        None) to ``recipients`` (helpers.simple_mail's default when None): its receipt."""
        from tests.integration.helpers import inline, simple_mail

        mail = simple_mail(name) if recipients is None else simple_mail(name, recipients=recipients)
        return self.enqueue_receipt(inline(queue, mail) if content is None else inline(queue, mail, content))

    def browsed(self, queue: str, **filters: object) -> list[browse_pb2.BrowseResponse]:
        """Browse: every response, ``filters`` being BrowseRequest fields."""
        return list(self.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, **filters)))

    def browsed_mails(self, queue: str, **filters: object) -> list[mail_pb2.QueuedMail]:
        """Browse: the mail of each response."""
        return [r.mail for r in self.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, **filters))]

    def browsed_names(self, queue: str, **filters: object) -> list[str]:
        """Browse: the name of each mail, in browse order."""
        return [r.mail.mail.name for r in self.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, **filters))]

    def browsed_by_name(self, queue: str, **filters: object) -> dict[str, mail_pb2.QueuedMail]:
        """Browse: name -> mail (a later mail of the same name wins)."""
        return {r.mail.mail.name: r.mail for r in self.browse_stub.Browse(browse_pb2.BrowseRequest(queue=queue, **filters))}

    def size(self, queue: str, exact: bool = False) -> int:
        """GetSize: from the counters, or (``exact``) counted from the view."""
        return self.browse_stub.GetSize(browse_pb2.GetSizeRequest(queue=queue, exact=exact)).size

    def info(self, queue: str, exact: bool = False) -> browse_pb2.QueueInfo:
        """GetQueue: the queue's info (its size from the counters unless ``exact``)."""
        return self.browse_stub.GetQueue(browse_pb2.GetQueueRequest(queue=queue, exact=exact)).queue_info


class Suite(BaseSuite):
    """The four services in-process (enqueue and dequeue reach blob_svc over gRPC, as deployed)."""

    kind = "in-process"

    def __init__(self, loop: LoopThread, keyspace: str, **env: str) -> None:
        from blob_svc.app import BlobApp
        from browse_svc.app import BrowseApp
        from dequeue_svc.app import DequeueApp
        from enqueue_svc.app import EnqueueApp

        self.loop = loop
        self.keyspace = keyspace
        self.blob = RunningApp(loop, BlobApp, "blob", service_env(keyspace, **env))
        self.env = service_env(keyspace, MAILQUEUE_BLOB_TARGET=self.blob.target, **env)
        self.enqueue = RunningApp(loop, EnqueueApp, "enqueue", self.env)
        self.dequeue = RunningApp(loop, DequeueApp, "dequeue", self.env)
        self.browse = RunningApp(loop, BrowseApp, "browse", self.env)
        self.apps = [self.enqueue, self.dequeue, self.browse, self.blob]
        self.view = self.browse.app.backends().view
        self._connect()

    def metric(self, service: str, name: str, **labels: str) -> float:
        from prometheus_client import REGISTRY  # one registry for the four in-process services

        return sum(s.value for m in REGISTRY.collect() for s in m.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def stop(self, drop: bool = False) -> None:
        for app in self.apps:
            app.stop()
        if drop:
            drop_keyspace(self.keyspace)


class ProcessSuite(BaseSuite):
    """The four services as separate processes (``python -m <name>_svc``), as deployed by default."""

    kind = "processes"

    def __init__(self, loop: LoopThread, keyspace: str) -> None:
        from services.adapters.cassandra.view import View
        from services.runtime.settings import cassandra_from_env

        self.loop = loop
        self.keyspace = keyspace
        self.blob = ServiceProcess("blob", service_env(keyspace), metrics=True)
        # The default: enqueue and dequeue read and write S3 themselves (the in-process Suite
        # goes through blob_svc, MAILQUEUE_BLOB_TARGET: both ways are tested).
        env = service_env(keyspace)
        self.enqueue = ServiceProcess("enqueue", env, metrics=True)
        self.dequeue = ServiceProcess("dequeue", env, metrics=True)
        self.browse = ServiceProcess("browse", env, metrics=True)
        self.processes = [self.enqueue, self.dequeue, self.browse, self.blob]
        settings = cassandra_from_env(env)
        self.view = loop.run(View.open(settings))
        self._connect()

    def metric(self, service: str, name: str, **labels: str) -> float:
        return getattr(self, service).metric(name, **labels)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        self.view.close()


@pytest.fixture(scope="session")
def suite(aio_loop: LoopThread, keyspace: str) -> Suite:
    s = Suite(aio_loop, keyspace)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def process_suite(aio_loop: LoopThread, keyspace: str) -> ProcessSuite:
    s = ProcessSuite(aio_loop, keyspace)
    yield s
    s.stop()


@pytest.fixture(params=["in-process", "processes"])
def contract_suite(request: pytest.FixtureRequest) -> BaseSuite:
    """A capability's contract suite runs against every implementation: the services in this
    process, and as separate processes (what `python -m <name>_svc` runs)."""
    return request.getfixturevalue("suite" if request.param == "in-process" else "process_suite")


@pytest.fixture(scope="module")
def fast_suite(aio_loop: LoopThread, running_stack: None) -> Suite:
    """A suite on a keyspace of its own whose slices are 1 second wide (several slices per test)."""
    s = Suite(aio_loop, new_keyspace(), MAILQUEUE_SLICE_WINDOW_S="1", MAILQUEUE_BROWSE_START_PACE="1000000")
    yield s
    s.stop(drop=True)
