"""A cancelled call stays cancelled. On Python 3.11, asyncio.wait_for returns the awaited result
when the cancellation arrives in the loop turn that result does (cpython gh-86296, fixed in 3.12
only): the cancelled handler goes on, and a WatchEvents whose client left as its consumer was
confirmed held its channel and its place among the process's watchers for ever. Shipped code
bounds a wait with ``asyncio.timeout``, which delivers the cancellation."""

import ast
import asyncio
import pathlib

import pytest

from services.adapters.rabbitmq.connection import NodeConnection
from services.adapters.rabbitmq.settings import RabbitMQSettings
from tests.unit.aio import run

SHIPPED = ("services", "enqueue_svc", "dequeue_svc", "browse_svc", "blob_svc", "webhook_svc", "mailq", "spark")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _wait_for_calls() -> list[str]:
    found = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "wait_for" and getattr(node.value, "id", "") == "asyncio":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_shipped_module_bounds_a_wait_with_asyncio_wait_for():
    assert _wait_for_calls() == []


def test_a_broker_answer_that_arrives_with_the_cancellation_does_not_swallow_it():
    conn = NodeConnection(RabbitMQSettings())

    async def answered_as_cancelled():
        fut = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(conn.answer(fut, "basic.consume"))
        await asyncio.sleep(0)  # it waits on the answer
        fut.set_result("consume-ok")  # the answer and the cancellation in one loop turn
        waiting.cancel()
        return await waiting

    with pytest.raises(asyncio.CancelledError):
        run(answered_as_cancelled())


def test_a_connection_whose_caller_left_while_it_opened_is_closed():
    """A node that takes the TCP connection and never answers the AMQP handshake: the caller
    leaves (a check's bound, a client gone). The connection it was opening had no owner and
    stayed open (its heartbeats would keep it); it is closed now."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    greeted, ended = threading.Event(), threading.Event()

    def node():
        peer, _ = server.accept()
        peer.settimeout(10)
        with peer:
            try:
                while peer.recv(4096):  # the protocol header, then nothing until it closes
                    greeted.set()
                ended.set()
            except OSError:
                pass

    threading.Thread(target=node, daemon=True).start()
    conn = NodeConnection(RabbitMQSettings(urls=(f"amqp://guest:guest@127.0.0.1:{port}/%2F",), connect_timeout_s=30))

    async def leave_while_opening():
        opening = asyncio.ensure_future(conn.connection())
        began = time.monotonic()
        while not greeted.is_set() and time.monotonic() - began < 5:  # connected, waiting for Connection.Start
            await asyncio.sleep(0.01)
        assert greeted.is_set()
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        began = time.monotonic()
        while not ended.is_set() and time.monotonic() - began < 3:
            await asyncio.sleep(0.05)  # the loop runs pika's close

    try:
        run(leave_while_opening())
        assert ended.is_set()
    finally:
        server.close()
