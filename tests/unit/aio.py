"""Running a coroutine from a pure-logic test."""

import asyncio


def run(coro):
    """On a loop of its own, leaving the thread's current loop as it was (other tests use it)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
