"""One RabbitMQ connection per process, with failover across the nodes of a cluster.

Contract: ``connection()`` returns an open connection to the first node that answers, starting
with the one connected last (or the one after a node that failed). A node is left when its
connection closes, when its heartbeats stop, when it opens no channel within
``connect_timeout_s``, or when the publisher says a confirm did not come (``leave``): the next call
connects to the next node of the list. Calls in flight on a lost connection fail with
BackendUnavailable (the client sees UNAVAILABLE and retries).

``channel()`` opens a channel on it (the caller closes it), and ``call()`` waits for the broker's
answer to one channel method, BackendUnavailable when none comes in time. Whoever keeps state
tied to the connection (the confirm channel) subscribes: told when the connection is replaced or
dropped, and when the broker blocks it (a resource alarm).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.channel import Channel

from services.adapters.rabbitmq.alarms import Blocking
from services.adapters.rabbitmq.channels import Waiters, resolver, unavailable
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)


def connection_parameters(url: str, settings: RabbitMQSettings) -> pika.URLParameters:
    """pika's parameters for one node; an amqps:// URL is TLS, verified against the settings' CA
    (or the system's) with the URL's host name checked."""
    params = pika.URLParameters(url)
    if url.startswith("amqps://"):
        context = ssl.create_default_context(cafile=settings.ca_file or None)
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    return params


def _close_opened(fut: asyncio.Future[Channel]) -> None:
    """Close a channel that opened for a caller that was cancelled meanwhile."""
    if not fut.cancelled() and fut.exception() is None and fut.result().is_open:
        fut.result().close()


class CoalescingConnection(AsyncioConnection):
    """pika's asyncio connection, writing the frames of one event-loop turn as one chunk.

    pika hands its transport each frame apart (a publish is three: method, header and body; an
    ack one), and the transport sends each with a send() of its own: over TLS, a record and a
    system call per frame. Here the frames emitted in one loop turn are joined and given to the
    transport once, at the next turn: a group's publishes, or a batch's acks, leave in one write
    (tests/integration/test_broker_writes.py counts them). Order is kept; what is still held when
    the stream is brought down is written first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held: list[bytes] = []
        super().__init__(*args, **kwargs)

    def _adapter_emit_data(self, data: bytes) -> None:
        if not self._held:
            self.ioloop.call_soon(self._write_held)
        self._held.append(data)

    def _write_held(self) -> None:
        held, self._held = self._held, []
        if held and self._transport is not None:
            super()._adapter_emit_data(held[0] if len(held) == 1 else b"".join(held))

    def _adapter_disconnect_stream(self) -> None:
        self._write_held()
        super()._adapter_disconnect_stream()


def _nothing(*_args: Any) -> None:
    return None


class NodeConnection:
    """This process's connection to one node of the list, and the failover to the next."""

    def __init__(self, settings: RabbitMQSettings) -> None:
        self._settings = settings
        self._nodes = [self._parameters(url, settings) for url in settings.urls]
        #: The node to try first: the one connected last, or the one after a node that failed.
        self._node = 0
        #: The connection in use (None until the first call, and after a node was left).
        self.current: AsyncioConnection | None = None
        self._lock = asyncio.Lock()
        #: What the broker told this process's connections about its resource alarms.
        self.blocking = Blocking()
        self._on_switch: Callable[[], None] = _nothing
        self._on_blocked: Callable[[str], None] = _nothing

    def subscribe(self, on_switch: Callable[[], None], on_blocked: Callable[[str], None]) -> None:
        """``on_switch()`` when the connection in use is replaced or dropped; ``on_blocked(reason)``
        when the broker blocks the connection in use."""
        self._on_switch, self._on_blocked = on_switch, on_blocked

    @staticmethod
    def _parameters(url: str, settings: RabbitMQSettings) -> pika.URLParameters:
        params = connection_parameters(url, settings)
        params.connection_attempts = 1
        params.socket_timeout = settings.connect_timeout_s
        params.heartbeat = settings.heartbeat_s
        return params

    async def connection(self) -> AsyncioConnection:
        if self.current is not None and self.current.is_open:
            return self.current
        async with self._lock:
            if self.current is not None and self.current.is_open:
                return self.current
            failures, refused = [], 0
            for attempt in range(len(self._nodes)):
                i = (self._node + attempt) % len(self._nodes)
                params = self._nodes[i]
                try:
                    conn = await self.open(params)
                except BackendUnavailable as e:
                    failures.append(f"{params.host}:{params.port}: {e.detail}")
                    refused += "ACCESS_REFUSED" in e.detail
                    continue
                self._node, self.current = i, conn
                self._on_switch()
                self.blocking.watch(conn, self._blocked)
                log.info("connected to rabbitmq", extra={"host": params.host, "port": params.port})
                return conn
            self._node = (self._node + 1) % len(self._nodes)
            if refused == len(self._nodes):  # an answer, not an outage: the operator must mend it
                user = getattr(self._nodes[0].credentials, "username", "")
                raise unavailable(f"RabbitMQ refused the login of user {user!r} ({'; '.join(failures)}): check the "
                                  "rabbitmq-username and rabbitmq-password files of MAILQUEUE_CREDENTIALS_DIR (or the "
                                  "user in MAILQUEUE_RABBITMQ_URL or _URLS), and that the user exists on the broker")
            raise unavailable(f"no RabbitMQ node answered ({'; '.join(failures)})")

    async def open(self, params: pika.URLParameters) -> AsyncioConnection:
        """A new connection to one node (not the one in use: the alarm watch keeps its own)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[AsyncioConnection] = loop.create_future()

        def on_error(_c: Any, err: Any) -> None:
            if not fut.done():
                fut.set_exception(unavailable(f"cannot connect ({str(err) or type(err).__name__})"))

        conn = CoalescingConnection(
            params,
            on_open_callback=resolver(fut),
            on_open_error_callback=on_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=loop,
        )
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                await fut
        except TimeoutError:
            self.abandon(conn)
            raise unavailable(f"no answer within {self._settings.connect_timeout_s}s") from None
        except asyncio.CancelledError:  # the caller left (a check's bound, a client gone): nobody would own it
            self.abandon(conn)
            raise
        return conn

    async def open_current_node(self) -> AsyncioConnection:
        """A new connection to the node this process uses now (for the alarm watch)."""
        return await self.open(self._nodes[self._node])

    def _on_connection_closed(self, conn: AsyncioConnection, reason: Any) -> None:
        self.blocking.forget(conn)
        if conn is self.current:
            log.warning("rabbitmq connection closed", extra={"reason": str(reason)})
            self.leave(conn)

    def _blocked(self, conn: AsyncioConnection, reason: str) -> None:
        if conn is self.current:
            self._on_blocked(reason)

    def leave(self, conn: AsyncioConnection) -> None:
        """Stop using ``conn``: the next call connects to the next node."""
        if conn is self.current:
            self.current = None
            self._on_switch()
            self._node = (self._node + 1) % len(self._nodes)

    @staticmethod
    def abandon(conn: AsyncioConnection) -> None:
        """Close a connection whose node may not answer (the close then ends with its heartbeat)."""
        try:
            if not (conn.is_closed or conn.is_closing):
                conn.close()
        except Exception as e:  # noqa: BLE001 - pika's state errors on a connection already going
            log.debug("closing an abandoned rabbitmq connection: %s", e)

    async def channel(self) -> tuple[Channel, Waiters]:
        """A new channel on the connection in use (its futures in the Waiters): the caller closes it."""
        conn = await self.connection()
        fut: asyncio.Future[Channel] = asyncio.get_running_loop().create_future()
        try:
            conn.channel(on_open_callback=resolver(fut))
        except Exception as e:  # pika raises its own connection-state errors here
            raise unavailable(e) from e
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                channel = await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(_close_opened)  # if it opens after all, nobody owns it
            raise
        except TimeoutError:
            fut.add_done_callback(_close_opened)
            # A node that cannot open a channel in seconds is gone (its connection may not know yet).
            self.leave(conn)
            self.abandon(conn)
            raise unavailable(f"no channel opened within {self._settings.connect_timeout_s}s") from None
        return channel, Waiters(channel)

    async def answer(self, fut: asyncio.Future[Any], what: str) -> Any:
        """The broker's answer to a channel call; BackendUnavailable when none comes in time."""
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                return await fut
        except TimeoutError:
            raise unavailable(f"no answer to {what} within {self._settings.connect_timeout_s}s") from None

    async def call(self, waiters: Waiters, method: Callable[..., Any], **kwargs: Any) -> Any:
        """Call a channel method and wait for the broker's answer (BackendUnavailable if none in time)."""
        fut = waiters.call(lambda callback: method(callback=callback, **kwargs))
        return await self.answer(fut, getattr(method, "__name__", "a channel call"))

    def close(self) -> None:
        if self.current is not None and self.current.is_open:
            self.current.close()
