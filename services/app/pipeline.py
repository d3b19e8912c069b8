"""Many operations from one stream, run concurrently (bounded), answered as each completes
(asyncio tasks: enqueue_svc's EnqueueMany)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def unordered(
    items: AsyncIterator[T], fn: Callable[[T], Awaitable[R]], limit: int,
) -> AsyncIterator[tuple[T, R | BaseException]]:
    """Run ``fn`` on every item of ``items``, ``limit`` at a time at most, and yield ``(item,
    result or exception)`` as each completes. Reading ``items`` pauses while ``limit`` run (not
    while answers wait to be sent: a client that sends every mail before it reads an answer must
    not stall on its own unread answers, which are kept meanwhile); an
    error of ``items`` itself (the stream) is raised after the running ones are answered."""
    async for group in unordered_groups(items, fn, limit):
        for entry in group:
            yield entry


async def unordered_groups(
    items: AsyncIterator[T], fn: Callable[[T], Awaitable[R]], limit: int,
) -> AsyncIterator[list[tuple[T, R | BaseException]]]:
    """As ``unordered``, but yields every ``(item, result)`` completed by then in one list (one
    or more: it never waits to fill a group)."""
    done: asyncio.Queue[tuple[T, R | BaseException] | None] = asyncio.Queue()
    slots = asyncio.Semaphore(limit)
    running: set[asyncio.Task[None]] = set()
    failure: list[BaseException] = []

    async def run(item: T) -> None:
        try:
            result: R | BaseException = await fn(item)
        except Exception as e:  # noqa: BLE001 - handed to the caller with its item
            result = e
        finally:
            slots.release()
        await done.put((item, result))

    async def read() -> None:
        try:
            async for item in items:
                await slots.acquire()
                task = asyncio.create_task(run(item))
                running.add(task)
                task.add_done_callback(running.discard)
        except Exception as e:  # noqa: BLE001 - raised once the others are answered
            failure.append(e)
        if running:
            await asyncio.wait(set(running))
        await done.put(None)

    reader = asyncio.create_task(read())
    try:
        ended = False
        while not ended and (entry := await done.get()) is not None:
            group = [entry]
            while not done.empty():
                more = done.get_nowait()
                if more is None:
                    ended = True
                    break
                group.append(more)
            yield group
        if failure:
            raise failure[0]
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()
