"""Structured logs: one JSON object per line on stderr, with the ``extra`` fields of each call."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
#: The values MAILQUEUE_LOG_LEVEL takes (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, worker: int = 0) -> None:
        super().__init__()
        self.service = service
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.worker:  # one of several processes of this service (services/runtime/workers.py)
            entry["worker"] = self.worker
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, (int, float, bool, str, type(None))) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class HandledChannelCloses(logging.Filter):
    """pika logs every channel the broker closes as a WARNING. Two of them are how the RabbitMQ
    adapter asks (services/adapters/rabbitmq/topology.py): a passive declare answered 404 while
    it waits for a queue another service declares, and a declaration answered 403 to a user who
    may not configure (dequeue_svc's). The adapter handles both: those lines are left out. Every
    other close (406 PRECONDITION_FAILED, 320, ...) stays a warning."""

    HANDLED = (403, 404)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not str(record.msg).startswith("Received remote Channel.Close"):
            return True
        code = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return code not in self.HANDLED


class Repeats(logging.Filter):
    """The client libraries (pika, the Cassandra driver) log every failed connection attempt, in
    several lines each: during a backend outage that was about 410 lines a minute from one
    service. Here each of their messages (logger, level and text before its arguments) passes
    once per ``window_s``; the next one to pass says how many were left out
    (``suppressed``). The services' own lines always pass: they say a failure once, then at a pace."""

    LIBRARIES = ("pika", "cassandra")
    #: Messages remembered at most (they are the libraries' fixed texts: a few dozen).
    MAX_KEPT = 1000

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window, self._clock = window_s, clock
        self._seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [passed at, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.partition(".")[0] not in self.LIBRARIES:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self._window:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.suppressed = int(seen[1])
        if len(self._seen) >= self.MAX_KEPT:
            self._seen.clear()
        self._seen[key] = [now, 0]
        return True


def level_of(env: Mapping[str, str]) -> str:
    """MAILQUEUE_LOG_LEVEL before the settings are read (INFO if it is none of Python's levels:
    the settings then refuse it, in a JSON line)."""
    level = env.get("MAILQUEUE_LOG_LEVEL", "INFO").upper()
    return level if level in LOG_LEVELS else "INFO"


def configure(service: str, level: str = "INFO", worker: int = 0) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, worker))
    if logging.getLevelName(level) != logging.DEBUG:  # DEBUG shows every line
        handler.addFilter(Repeats())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("pika", "cassandra"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    channel = logging.getLogger("pika.channel")
    if root.level > logging.DEBUG and not any(isinstance(f, HandledChannelCloses) for f in channel.filters):
        channel.addFilter(HandledChannelCloses())
