"""One harness for the service processes: start ``python -m <name>_svc`` with an environment
(a test's: ``service_env`` on a ``new_keyspace``), wait until gRPC health says SERVING, stop them
(SIGTERM, then SIGKILL), poll for a state with a deadline (``wait_until``), and remove what a run
left in the backends (a mail queue's RabbitMQ queues and exchanges, a keyspace, a bucket).

Used by stack/services.sh (``python -m stack.services``), the tests and bench/common.py. The one
thing the tests add is in tests/inprocess.py: the services served inside the test process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The seconds a service gets to become SERVING, and to end after SIGTERM before SIGKILL.
START_DEADLINE_S = 60.0
STOP_GRACE_S = 15.0


def stack_dir() -> str:
    """The local stack's state: pid files, logs, PKI, credentials (MAILQUEUE_STACK_DIR, default .stack)."""
    return os.environ.get("MAILQUEUE_STACK_DIR", os.path.join(ROOT, ".stack"))


class StackFailed(subprocess.CalledProcessError):
    """``stack.sh`` ended with an error: its message carries what the script printed."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stdout or ''}\n{(self.stderr or '')[-3000:]}"


def stack(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``stack/stack.sh ARGS``, its output captured; StackFailed (with that output) when ``check``
    and it fails, subprocess.TimeoutExpired past ``timeout`` seconds."""
    p = subprocess.run([os.path.join(ROOT, "stack", "stack.sh"), *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise StackFailed(p.returncode, p.args, p.stdout, p.stderr)
    return p


#: How long ``rabbitmqctl stop_app`` and ``start_app`` may take before the broker is started over
#: by ``stack.sh up``: a start recovers every quorum queue's log (219 s seen on a loaded machine).
BROKER_STOP_S = 180.0
BROKER_START_S = 360.0


@contextlib.contextmanager
def broker_stopped() -> Iterator[None]:
    """The single-node RabbitMQ's app stopped for the block (``rabbitmqctl stop_app``: the node
    stays up, clients are refused), and started again however the block ends. A start that fails
    or overruns ``BROKER_START_S`` falls back on ``stack.sh up``, which starts the app (or the
    node): a test that failed half-way never leaves the broker down for the tests after it."""
    try:
        stack("rabbitmqctl", "stop_app", timeout=BROKER_STOP_S)  # a stop that failed half-way is started too
        yield
    finally:
        start_broker()


def start_broker() -> None:
    """RabbitMQ's app started again after ``broker_stopped``; see there."""
    try:
        p = stack("rabbitmqctl", "start_app", check=False, timeout=BROKER_START_S)
        if p.returncode == 0:
            return
        why = f"rabbitmqctl start_app failed ({p.returncode}): {p.stderr.strip()[-500:]}"
    except subprocess.TimeoutExpired:
        why = f"rabbitmqctl start_app still running after {BROKER_START_S:.0f} s"
    print(f"[stack] {why}; starting the broker again with stack.sh up")
    stack("up")


def stack_whole(who: str) -> None:
    """Start whatever of the local stack is down (``stack.sh up``; a stopped RabbitMQ app too),
    saying so for ``who``; nothing when every component is healthy."""
    status = stack("status", check=False)
    if status.returncode != 0:
        print(f"\n[{who}] the local stack is not healthy:\n{status.stdout}starting what is down (stack.sh up)")
        stack("up")


def stack_env(role: str = "operator") -> dict[str, str]:
    """The MAILQUEUE_* variables of ``role`` on the single-node stack (stack/stack.sh env ROLE):
    backends over TLS with that role's own credential."""
    out = {}
    for line in stack("env", role).stdout.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def credentials_dir(role: str) -> str:
    return os.path.join(stack_dir(), "credentials", role)


def as_service(name: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the backend credential of service ``name`` (its own Cassandra role, RabbitMQ
    user and S3 user) in place of the operator's, when the stack made one: services under test
    run with exactly the rights they have in production."""
    own = credentials_dir(name)
    if env.get("MAILQUEUE_CREDENTIALS_DIR") == credentials_dir("operator") and os.path.isdir(own):
        return {**env, "MAILQUEUE_CREDENTIALS_DIR": own}
    return env


_PREPARED: set[tuple[str, ...]] = set()


def prepare(env: dict[str, str]) -> None:
    """What the operator does before services use a keyspace and a bucket: the schema step with
    the schema role (services may not create tables), and the bucket with the operator's
    credential (services may not create buckets). Once per keyspace and bucket per process."""
    from services.runtime.settings import cassandra_from_env, s3_from_env

    if "MAILQUEUE_CREDENTIALS_DIR" not in env:
        return  # a stack without credentials: the services create what they need
    c = cassandra_from_env(env)
    key = ("cassandra", ",".join(c.hosts), str(c.port), c.keyspace)
    if key not in _PREPARED:
        from services.domain.errors import BackendUnavailable
        from services.runtime.migrate import migrate, service_roles

        schema_env = {**env, "MAILQUEUE_CREDENTIALS_DIR": credentials_dir("schema")}
        try:
            migrate(cassandra_from_env(schema_env), service_roles(schema_env))
            _PREPARED.add(key)
        except BackendUnavailable:
            pass  # a test of a Cassandra that does not answer: the service says so itself
    s3 = s3_from_env({**env, "MAILQUEUE_CREDENTIALS_DIR": credentials_dir("operator")})
    key = ("s3", s3.endpoint, s3.bucket)
    if key not in _PREPARED:
        from services.adapters.s3 import errors as s3errors
        from services.adapters.s3.client import Bucket

        bucket = Bucket(s3)
        try:
            if not bucket.exists():
                bucket.create()
            _PREPARED.add(key)
        except s3errors.ERRORS:
            pass  # a test of an S3 that does not answer


def broker_parameters(env: Mapping[str, str] | None = None):  # noqa: ANN201
    """pika's parameters for the broker ``env`` names (default: this process's), over TLS."""
    from services.adapters.rabbitmq.connection import connection_parameters
    from services.runtime.settings import rabbitmq_from_env

    settings = rabbitmq_from_env(os.environ if env is None else env)
    return connection_parameters(settings.url, settings)


def new_keyspace() -> str:
    """A keyspace name of a test's own (each test session makes one: tests never see dev data)."""
    return f"mq_test_{uuid.uuid4().hex[:12]}"


def service_env(keyspace: str, **extra: str) -> dict[str, str]:
    """A service's environment on a keyspace of the test's own: the operator's variables (the
    backends over TLS), gRPC in the clear on loopback (explicitly: MAILQUEUE_PLAINTEXT; the TLS
    tests serve TLS), and the keyspace prepared as the operator would (``prepare``)."""
    env = dict(os.environ)
    env["MAILQUEUE_PLAINTEXT"] = "true"
    # Gauges and the healer off: a test keyspace holds hundreds of queues (tests that need them turn them on).
    # Counter updates written at once: tests compare counters with exact counts right away (the
    # gathering has a test of its own).
    env.update({"MAILQUEUE_CASSANDRA_KEYSPACE": keyspace, "MAILQUEUE_PORT": "0", "MAILQUEUE_METRICS_PORT": "0",
                "MAILQUEUE_GAUGE_INTERVAL_S": "0", "MAILQUEUE_COUNTER_FLUSH_S": "0", "MAILQUEUE_HEAL_INTERVAL_S": "0"})
    env.update(extra)
    if env.get("MAILQUEUE_TLS_CERT_FILE"):
        env.pop("MAILQUEUE_PLAINTEXT")
    elif "MAILQUEUE_TLS_CA_FILE" not in extra:
        env.pop("MAILQUEUE_TLS_CA_FILE", None)  # calls to a plaintext blob_svc: in the clear too
    prepare(env)
    return env


# -- ports, health and polling ----------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(target: str, service: str = "", credentials: grpc.ChannelCredentials | None = None,
           timeout: float = 2) -> int:
    """The gRPC health status of ``service`` ("": the server's overall one, readiness; "liveness"),
    -1 when the server does not answer. ``credentials``: over TLS."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with (grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)) as ch:
        try:
            return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
        except grpc.RpcError:
            return -1


def is_serving(target: str, credentials: grpc.ChannelCredentials | None = None, timeout: float = 2) -> bool:
    """The server at ``target`` answers and its health says SERVING."""
    from grpc_health.v1 import health_pb2

    return health(target, credentials=credentials, timeout=timeout) == health_pb2.HealthCheckResponse.SERVING


def listed_services(target: str) -> set[str]:
    """The services the server's reflection lists."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        return {s.name for r in responses for s in r.list_services_response.service}


def wait_until(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05,
               what: str | Callable[[], str] = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds
    (``what``: the condition's words, or a function giving them as things stand then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def tls_credentials(ca_file: str) -> grpc.ChannelCredentials | None:
    """Client credentials trusting the CA in ``ca_file``; None when it cannot be read."""
    try:
        with open(ca_file, "rb") as f:
            return grpc.ssl_channel_credentials(f.read())
    except OSError:
        return None


class NotServing(RuntimeError):
    """A service that did not become SERVING in time, or ended while starting."""


# -- processes --------------------------------------------------------------------------------


def alive(pid: int, name: str) -> bool:
    """Process ``pid`` exists, is not a zombie (killed, not yet reaped) and is ``name``_svc (a pid
    reused by another program does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return False
    return state != "Z" and f"-m {name}_svc" in cmdline


class Service:
    """One service process, ``python -m <name>_svc``, with exactly ``env`` (the caller sets
    MAILQUEUE_PORT to ``port``). ``log``: a file its stdout and stderr are appended to (None: this
    process's); ``credentials``: health and channels over TLS; ``detach``: in a session of its own
    (it outlives the caller, as stack/services.sh starts them)."""

    def __init__(self, name: str, env: Mapping[str, str], port: int, *, log: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None, python: str | None = None,
                 detach: bool = False, stdout: int | IO[Any] | None = None) -> None:
        self.name = name
        self.env = dict(env)
        self.port = port
        self.target = f"127.0.0.1:{port}"
        self.log = log
        self.credentials = credentials
        self.python = python or sys.executable
        self.detach = detach
        self.stdout = stdout
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, wait: bool = True, deadline: float = START_DEADLINE_S) -> None:
        """Start the process and (``wait``) wait until its health says SERVING."""
        command = [self.python, "-m", f"{self.name}_svc"]
        options: dict[str, Any] = {"cwd": ROOT, "env": self.env, "start_new_session": self.detach}
        if self.detach:
            options["stdin"] = subprocess.DEVNULL
        if self.log is None:
            self.proc = subprocess.Popen(command, stdout=self.stdout, **options)
        else:
            os.makedirs(os.path.dirname(self.log) or ".", exist_ok=True)
            with open(self.log, "ab") as log:
                out = log if self.stdout is None else self.stdout
                self.proc = subprocess.Popen(command, stdout=out, stderr=log, **options)
        if wait:
            self.wait_serving(deadline)

    def serving(self) -> bool:
        return is_serving(self.target, self.credentials)

    def wait_serving(self, deadline: float = START_DEADLINE_S, interval: float = 0.1) -> None:
        """Poll health until SERVING; NotServing (naming the log) after ``deadline`` seconds or
        when the process ends first."""
        end = time.monotonic() + deadline
        while not self.serving():
            where = f": read {self.log}" if self.log else ""
            if self.proc is not None and self.proc.poll() is not None:
                raise NotServing(f"{self.name}_svc exited with {self.proc.returncode} before SERVING{where}")
            if time.monotonic() > end:
                raise NotServing(f"{self.name}_svc is not SERVING after {deadline:g} s{where}")
            time.sleep(interval)

    def channel(self) -> grpc.Channel:
        if self.credentials is not None:
            return grpc.secure_channel(self.target, self.credentials)
        return grpc.insecure_channel(self.target)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (its graceful shutdown), SIGKILL if it still runs after ``grace`` seconds
        (``grace`` 0: SIGKILL at once)."""
        if not self.running():
            return
        assert self.proc is not None
        if grace > 0:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                pass
        self.proc.kill()
        self.proc.wait()

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


class ServiceProcess(Service):
    """A real service process (``python -m <name>_svc``) on a free loopback port, with the
    service's own backend credential (``as_service``); its log (WARNING and above) in a file
    under the temporary directory, for the failure that needs it. ``stop`` kills it at once
    (SIGKILL), as the tests and benches that use it always did; ``stop(grace=...)`` ends it gracefully first."""

    def __init__(self, name: str, env: dict[str, str], metrics: bool = False,
                 credentials: grpc.ChannelCredentials | None = None, wait: bool = True) -> None:
        port = free_port()
        self.metrics_port = free_port() if metrics else 0
        env = {**as_service(name, env), "MAILQUEUE_PORT": str(port), "MAILQUEUE_METRICS_PORT": str(self.metrics_port),
               "MAILQUEUE_LOG_LEVEL": "WARNING"}
        log = os.path.join(tempfile.gettempdir(), f"mailqueue-test-{name}-{port}.log")
        super().__init__(name, env, port, log=log, credentials=credentials, stdout=subprocess.DEVNULL)
        self.start(wait)

    def stop(self, grace: float = 0) -> None:
        super().stop(grace)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus sample's values, over the samples whose labels include ``labels``."""
        return scrape(self.metrics_port, name, **labels)


def stop_pid(pid: int, name: str, grace: float = STOP_GRACE_S) -> None:
    """Stop a service this process did not start (a pid file's): SIGTERM, SIGKILL after ``grace`` s."""
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
    end = time.monotonic() + grace
    while alive(pid, name) and time.monotonic() < end:
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def stop_all(services: Iterable[Service], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to every one first, then wait for each (SIGKILL after ``grace`` seconds)."""
    services = list(services)
    for s in services:
        if s.running() and grace > 0:
            assert s.proc is not None
            s.proc.terminate()
    for s in services:
        s.stop(grace)


# -- cleanup ----------------------------------------------------------------------------------


def mail_queue_objects(queue: str) -> tuple[list[str], list[str]]:
    """(RabbitMQ queues, exchanges) of mail queue ``queue``: the work queue of every delivery class
    and the dead-letter queue; its exchange and its dead-letter exchange (what the broker adapter
    declares and deletes)."""
    from services.domain import model, names

    queues = [names.work_queue(queue, p) for p in model.PRIORITIES] + [names.dead_letter_queue(queue)]
    return queues, [names.exchange(queue), names.dead_letter_exchange(queue)]


def drop_queues(queues: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """Delete the RabbitMQ queues and exchanges of each mail queue in ``queues`` (every priority
    class's work queue and the dead-letter queue), on the broker ``env`` names."""
    import pika

    queues = list(queues)
    if not queues:
        return
    with pika.BlockingConnection(broker_parameters(env)) as conn:
        ch = conn.channel()
        for q in queues:
            rabbit_queues, exchanges = mail_queue_objects(q)
            for rq in rabbit_queues:
                ch.queue_delete(rq)
            for ex in exchanges:
                ch.exchange_delete(ex)


def drop_keyspace(name: str, env: Mapping[str, str] | None = None) -> None:
    """DROP KEYSPACE ``name`` on the Cassandra ``env`` names (default: this process's)."""
    from services.adapters.cassandra.session import connect
    from services.runtime.settings import cassandra_from_env

    cluster, session = connect(cassandra_from_env(os.environ if env is None else env))
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=120)
    finally:
        cluster.shutdown()
    drop_event_stream(name, env)


def drop_event_stream(keyspace: str, env: Mapping[str, str] | None = None) -> None:
    """Delete the broker objects of the view in ``keyspace``: its event stream and exchange
    (browse_svc declares them at start-up; a test's stream does not stay on the broker's disk for
    its retention) and its dead-letter marks queue (dequeue_svc's: a quorum queue, left behind it
    costs the broker a Raft member for good)."""
    import pika

    from services.domain import names

    try:
        with pika.BlockingConnection(broker_parameters(env)) as conn:
            ch = conn.channel()
            ch.queue_delete(names.event_stream(keyspace))
            ch.exchange_delete(names.event_stream(keyspace))
            ch.queue_delete(names.dead_letter_marks_queue(keyspace))
    except pika.exceptions.AMQPError:
        pass  # a test that stopped the broker: the stream stays, bounded by its retention


def drop_bucket(bucket: str, env: Mapping[str, str] | None = None) -> bool:
    """Remove ``bucket`` and everything in it from the S3 ``env`` names; False when it did not exist."""
    import dataclasses

    from services.adapters.s3 import client as s3client
    from services.runtime.settings import s3_from_env

    b = s3client.Bucket(dataclasses.replace(s3_from_env(os.environ if env is None else env), bucket=bucket))
    if not b.exists():
        return False
    b.drop()
    return True


# -- metrics ----------------------------------------------------------------------------------


def scrape(port: int, name: str, host: str = "127.0.0.1", **labels: str) -> float:
    """Sum of a Prometheus sample's values served on ``host:port``, over the samples whose labels include ``labels``."""
    import re
    import urllib.request

    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for sample_labels, value in re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", body, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', sample_labels))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
