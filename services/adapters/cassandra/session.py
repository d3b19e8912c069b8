"""Cassandra connection and the asyncio bridge for the driver's futures.

Driver exceptions are converted here into BackendUnavailable; nothing above sees a driver error.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from cassandra import ConsistencyLevel, DriverException, InvalidRequest, UnresolvableContactPoints
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable, Session
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
from cassandra.protocol import ErrorMessage
from cassandra.query import named_tuple_factory

from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.cassandra.statement_kinds import count
from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Driver failures that mean "Cassandra did not answer" rather than "the query is wrong".
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (DriverException, NoHostAvailable, OSError, TimeoutError)
#: Server errors the driver has no class for but that mean the same: overloaded, bootstrapping,
#: CDC write failure, and a lightweight transaction whose result is unknown (accepted by fewer
#: replicas than a quorum: seen on the 3-node cluster with two nodes down).
UNAVAILABLE_CODES = frozenset({0x1001, 0x1002, 0x1600, 0x1700})


#: What an InvalidRequest says when it is an outage after all: a node that restarted under load
#: answers for a while that a table or keyspace it has not loaded yet does not exist (schema.py).
SCHEMA_NOT_LOADED = ("unconfigured table", "doesn't exist", "does not exist")


def request_defect(e: BaseException) -> bool:
    """An InvalidRequest that says the request itself is wrong (a key over 64 KiB): no retry can
    succeed, so it is not an outage but a server defect (INTERNAL, logged with its trace), never
    "retry it". Unauthorized stays an outage: Cassandra answers it too when it cannot read a role's
    permissions (too few replicas up)."""
    return isinstance(e, InvalidRequest) and not any(m in str(e) for m in SCHEMA_NOT_LOADED)


def unavailable(e: BaseException) -> bool:
    if request_defect(e):
        return False
    return isinstance(e, UNAVAILABLE_ERRORS) or (isinstance(e, ErrorMessage) and getattr(e, "code", None) in UNAVAILABLE_CODES)


_ROW_CLASSES: dict[tuple[str, ...], Any] = {}
#: Seconds between heartbeats on a connection that received nothing, and to wait for the answer:
#: a hung node is left within about 6 s (measured on the 3-node cluster: tests/cluster).
HEARTBEAT_S = 2
HEARTBEAT_TIMEOUT_S = 4
#: Seconds past the driver's own request timeout after which a request it has not answered is
#: given up (BackendUnavailable). The driver answers every request (rows, an error, or
#: OperationTimedOut once MAILQUEUE_CASSANDRA_TIMEOUT_S is over); an answer it loses all the same
#: (drivers have had such bugs, PYTHON-1044) must not hold a caller, or the queue counters'
#: flushes that an admin call waits for, for ever (issue 47).
LOST_ANSWER_GRACE_S = 5.0


def named_tuple_rows(colnames: list[str], rows: list[Any]) -> list[Any]:
    """The driver's default row factory, with each row class built once per column list.

    The driver builds a new namedtuple class for every result, about 100 µs of CPU: on the
    dequeue path (one point read per delivery) that was 3 % of the service's CPU.
    """
    key = tuple(colnames)
    cls = _ROW_CLASSES.get(key)
    if cls is None:
        if len(_ROW_CLASSES) > 1000:
            _ROW_CLASSES.clear()
        # One row whose values are the column names: the driver names and cleans the class.
        cls = _ROW_CLASSES[key] = type(named_tuple_factory(colnames, [key])[0])
    return [cls(*row) for row in rows]


def tls_context(settings: CassandraSettings) -> ssl.SSLContext | None:
    """Client encryption when a CA is configured: the node's chain must lead to that CA. Host names
    are not checked: the driver connects to the addresses the nodes advertise (rpc_address), which
    behind a forwarder or a Kubernetes Service are not the names a certificate carries; the CA
    (one for the backends, not a public one) is what authenticates the node."""
    if not settings.ca_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.ca_file)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def connect(settings: CassandraSettings) -> tuple[Cluster, Session]:
    """Connect (blocking): call it from a thread. Raises BackendUnavailable."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc)),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=settings.request_timeout_s,
        row_factory=named_tuple_rows,
    )
    auth = PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    try:
        return _connect(settings, profile, auth)
    except UnresolvableContactPoints as e:  # the driver resolves the names here, before connecting
        # Not a crash: a pod can start before cluster DNS answers (exit 1, CrashLoopBackOff, twice
        # in a CI run). An outage like any other: NOT_SERVING, tried again.
        raise BackendUnavailable("cassandra", f"no address for MAILQUEUE_CASSANDRA_HOSTS {','.join(settings.hosts)}: "
                                 "check the names, and that DNS answers") from e


def _connect(settings: CassandraSettings, profile: ExecutionProfile, auth: PlainTextAuthProvider | None) -> tuple[Cluster, Session]:
    cluster = Cluster(
        list(settings.hosts),
        ssl_context=tls_context(settings),
        port=settings.port,
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        auth_provider=auth,
        connect_timeout=settings.request_timeout_s,
        # The driver leaves Nagle on: a request over one TCP segment (a 10 KiB content write) then
        # waits for the server's delayed ACK, 40 ms on Linux, on every write.
        sockopts=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        # A hung node (paused, partitioned) keeps its TCP connections open: without an answer to a
        # heartbeat within HEARTBEAT_S its connections are closed and the node is marked down, so
        # requests stop going to it (the driver's defaults, 30 s + 30 s, cost a minute of timeouts).
        idle_heartbeat_interval=HEARTBEAT_S,
        idle_heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        # A node back from the dead is used again within seconds (default: up to 10 minutes).
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=10.0),
    )
    try:
        return cluster, cluster.connect()
    except UNAVAILABLE_ERRORS as e:
        cluster.shutdown()
        raise BackendUnavailable("cassandra", f"cannot connect to {settings.hosts}:{settings.port} ({e})") from e


async def execute(session: Session, statement: Any, params: Any = None, kind: str | None = None) -> list[Any]:
    """Run one statement without blocking the event loop; return the first page of rows.

    Use only for statements whose result fits one page (writes, point reads); large reads page
    with :func:`execute_all`. ``kind``: how a batch is counted (statement_kinds.py), else the
    statement's own kind.
    """
    count(statement, kind)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[Any]] = loop.create_future()

    def ok(rows: Any) -> None:
        loop.call_soon_threadsafe(_resolve, fut, list(rows or []), None)

    def err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_resolve, fut, None, exc)

    try:
        session.execute_async(statement, params).add_callbacks(ok, err)
    except UNAVAILABLE_ERRORS as e:
        raise BackendUnavailable("cassandra", str(e)) from e
    deadline_s = _answer_deadline_s(session)
    lost = loop.call_later(deadline_s, _give_up, fut, deadline_s)
    try:
        return await fut
    except Exception as e:
        if unavailable(e):
            raise BackendUnavailable("cassandra", f"{type(e).__name__}: {e}") from e
        raise
    finally:
        lost.cancel()


def _answer_deadline_s(session: Session) -> float:
    return (session.get_execution_profile(EXEC_PROFILE_DEFAULT).request_timeout or 0.0) + LOST_ANSWER_GRACE_S


def _give_up(fut: asyncio.Future[Any], after_s: float) -> None:
    if not fut.done():
        log.warning("a Cassandra request the driver never answered was given up", extra={"after_s": after_s})
        fut.set_exception(BackendUnavailable("cassandra", f"no answer from the driver within {after_s:g} s"))


async def execute_all(session: Session, statement: Any, params: Any = None) -> list[Any]:
    """Run a read and fetch every page (in a worker thread)."""
    count(statement)
    return await _in_thread(lambda: list(session.execute(statement, params)))


async def _in_thread(run: Callable[[], T]) -> T:
    """A blocking driver call in a worker thread; an outage is BackendUnavailable."""
    try:
        return await asyncio.to_thread(run)
    except Exception as e:
        if unavailable(e):
            raise BackendUnavailable("cassandra", f"{type(e).__name__}: {e}") from e
        raise


async def execute_page(
    session: Session, statement: Any, params: Any, fetch: int, paging_state: bytes | None,
) -> tuple[list[Any], bytes | None]:
    """One page of a read (in a worker thread): up to ``fetch`` rows from ``paging_state`` (None:
    the first), and the paging state of the rest (None: no more rows)."""
    bound = statement.bind(params)
    bound.fetch_size = fetch
    count(statement)

    def run() -> tuple[list[Any], bytes | None]:
        rs = session.execute(bound, paging_state=paging_state)
        return list(rs.current_rows), rs.paging_state if rs.has_more_pages else None

    return await _in_thread(run)


async def execute_pages(session: Session, statement: Any, params: Any, first: int = 100, most: int = 5000) -> AsyncIterator[list[Any]]:
    """A read page by page, lazily: ``first`` rows, then twice as many each time up to ``most``."""
    state: bytes | None = None
    fetch = first
    while True:
        rows, state = await execute_page(session, statement, params, fetch, state)
        if rows:
            yield rows
        if state is None:
            return
        fetch = min(fetch * 2, most)


def _resolve(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
