"""A thread that watches the event loop and says when it is blocked.

Everything a service does runs on one asyncio loop: its calls, its health answers, its backend
checks and its logs. A loop that runs no callback (a CPU-bound walk, a blocking call) holds every
call and says nothing; the health checks that would report it wait too, so probes with a timeout
fail, but without a reason. This thread gives the reason: once the loop has run nothing for
``BLOCKED_S`` it logs an error with the loop thread's stack (where it is stuck), and when the loop
runs again, for how long it was blocked (``mailqueue_event_loop_blocked_seconds_total``).
Issue 47: browse_svc logged nothing for 56 s while a cancel walked a chain of futures.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from prometheus_client import Counter

log = logging.getLogger(__name__)

#: Seconds without a loop turn that count as blocked (a busy loop turns every few milliseconds).
BLOCKED_S = 2.0
#: Frames of the loop thread's stack that the log line shows (innermost last).
STACK_FRAMES = 12

BLOCKED = Counter("mailqueue_event_loop_blocked_seconds_total",
                  f"Seconds the event loop ran no callback, counted for each block longer than {BLOCKED_S:g} s")


class LoopWatchdog:
    """Started on the loop's own thread (``start`` reads which thread that is); ``stop`` ends it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, blocked_s: float = BLOCKED_S) -> None:
        self._loop = loop
        self._blocked_s = blocked_s
        self._stopped = threading.Event()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.is_set():
            turned = threading.Event()
            sent = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(turned.set)
            except RuntimeError:  # the loop is closed
                return
            if turned.wait(self._blocked_s):
                self._stopped.wait(self._blocked_s / 4)
                continue
            frame = sys._current_frames().get(self._loop_thread)  # noqa: SLF001 - the one way to read another thread's stack
            stack = "".join(traceback.format_stack(frame)[-STACK_FRAMES:]) if frame is not None else "(not found)"
            log.error("event loop blocked: no call, health check or log runs until it turns again",
                      extra={"blocked_s": round(time.monotonic() - sent, 1), "stack": stack})
            while not turned.wait(self._blocked_s) and not self._stopped.is_set():
                pass
            blocked = time.monotonic() - sent
            BLOCKED.inc(blocked)
            log.warning("event loop turns again", extra={"blocked_s": round(blocked, 1)})
