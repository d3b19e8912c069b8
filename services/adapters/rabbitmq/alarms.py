"""RabbitMQ's resource alarms as this process sees them: does the broker block publishers now?

When a node runs low on memory or disk (its memory or disk alarm), RabbitMQ blocks publishing
connections, cluster-wide: it stops reading from each one that publishes, so a publish waits for
its confirm until the alarm is lifted. It tells such a connection why (``connection.blocked``:
"low on disk", "low on memory") and, once the alarm is lifted, ``connection.unblocked``. It tells
a connection only when that connection publishes after the alarm began (rabbit_reader blocks on
the first publish it reads), so a process that publishes nothing would not know.

``Blocking`` keeps what the connections of this process were told. ``AlarmWatch`` keeps one
connection of its own that publishes an empty, transient message every ``PROBE_INTERVAL_S`` to an
exchange bound to nothing (names.alarm_probe_exchange: the broker drops it): within a probe of an
alarm the broker blocks that connection and says why, whether or not anything else is published.
That connection does nothing else, so its being blocked holds up nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from prometheus_client import Gauge

from services.adapters.rabbitmq.channels import Waiters, resolver, unavailable
from services.domain import names
from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)

BLOCKED = Gauge("mailqueue_broker_blocked",
                "1 while RabbitMQ blocks this process's publishes (a memory or disk alarm): Enqueue refuses at once")
#: Seconds between two probes of the alarm watch (and between its reconnection attempts).
PROBE_INTERVAL_S = 1.0
#: Seconds the watch waits for its channel and exchange declaration.
PROBE_SETUP_TIMEOUT_S = 5.0

BlockedCallback = Callable[[AsyncioConnection, str], None]


class Blocking:
    """Why the broker blocks this process's publishers, from what its connections were told."""

    def __init__(self) -> None:
        self._reasons: dict[AsyncioConnection, str] = {}
        self._since = 0.0

    def watch(self, conn: AsyncioConnection, on_blocked: BlockedCallback | None = None) -> None:
        """Follow ``conn``'s blocked and unblocked notices (call ``forget`` when it closes)."""

        def blocked(c: AsyncioConnection, frame: Any) -> None:
            reason = str(getattr(frame.method, "reason", "") or "a resource alarm")
            self._set(c, reason)
            if on_blocked is not None:
                on_blocked(c, reason)

        conn.add_on_connection_blocked_callback(blocked)
        conn.add_on_connection_unblocked_callback(lambda c, _frame: self.forget(c))

    def blocks(self, conn: AsyncioConnection) -> bool:
        return conn in self._reasons

    def reason(self) -> str | None:
        """The broker's words ("low on disk") while any connection is blocked, else None."""
        return next(iter(self._reasons.values()), None)

    def _set(self, conn: AsyncioConnection, reason: str) -> None:
        if not self._reasons:
            self._since = time.monotonic()
            BLOCKED.set(1)
            log.warning("rabbitmq blocks publishers: %s (a resource alarm); enqueues are refused until it is lifted",
                        reason, extra={"reason": reason})
        self._reasons[conn] = reason

    def forget(self, conn: AsyncioConnection) -> None:
        """``conn`` was unblocked, or closed."""
        if self._reasons.pop(conn, None) is not None and not self._reasons:
            BLOCKED.set(0)
            log.warning("rabbitmq accepts publishes again", extra={"blocked_s": round(time.monotonic() - self._since, 1)})


class AlarmWatch:
    """One connection that publishes a probe every ``interval_s`` while the broker does not block it."""

    def __init__(self, connect: Callable[[], Awaitable[AsyncioConnection]], blocking: Blocking,
                 interval_s: float = PROBE_INTERVAL_S) -> None:
        self._connect = connect
        self._blocking = blocking
        self._interval_s = interval_s
        self._conn: AsyncioConnection | None = None
        self._channel: Any = None

    async def run(self) -> None:
        """Probe forever (a background task); a broker that does not answer is tried again later
        (its outage is the health check's to report: said here once per streak of failures)."""
        failing = False
        try:
            while True:
                try:
                    await self._probe()
                    failing = False
                except BackendUnavailable as e:
                    (log.debug if failing else log.warning)("alarm watch: %s", e)
                    failing = True
                    self._drop()
                await asyncio.sleep(self._interval_s)
        finally:
            self._drop()

    async def _probe(self) -> None:
        if self._channel is None or not self._channel.is_open:
            await self._open()
        if self._conn is not None and self._blocking.blocks(self._conn):
            return  # blocked: nothing is read from it until connection.unblocked
        self._channel.basic_publish(names.alarm_probe_exchange(), "", b"", pika.BasicProperties(delivery_mode=1))

    async def _open(self) -> None:
        self._drop()
        conn = await self._connect()
        self._conn = conn
        self._blocking.watch(conn)
        conn.add_on_close_callback(lambda c, _reason: self._blocking.forget(c))
        opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            conn.channel(on_open_callback=resolver(opened))
        except Exception as e:  # pika's connection-state errors
            raise unavailable(f"alarm watch: {e}") from e
        channel = await self._wait(opened, "a channel")
        declared = Waiters(channel).new()  # fails if the broker closes the channel (a refusal)
        channel.exchange_declare(names.alarm_probe_exchange(), exchange_type="fanout", durable=True,
                                 callback=resolver(declared))
        await self._wait(declared, "the declaration of the probe exchange")
        self._channel = channel

    async def _wait(self, fut: asyncio.Future[Any], what: str) -> Any:
        try:
            async with asyncio.timeout(PROBE_SETUP_TIMEOUT_S):
                return await fut
        except TimeoutError:
            raise unavailable(f"alarm watch: no answer for {what} within {PROBE_SETUP_TIMEOUT_S}s") from None

    def _drop(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            self._blocking.forget(conn)
            if not (conn.is_closed or conn.is_closing):
                conn.close()
