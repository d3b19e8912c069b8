"""How to reach RabbitMQ and how its queues are declared: a plain value, built from
MAILQUEUE_RABBITMQ_* (and the credentials folder) by services/runtime/settings.py, which
describes each variable."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RabbitMQSettings:
    urls: tuple[str, ...] = ("amqp://guest:guest@127.0.0.1:5672/%2F",)
    queue_type: str = "quorum"
    delivery_limit: int = 20
    connect_timeout_s: float = 5.0
    heartbeat_s: int = 5
    confirm_timeout_s: float = 10.0
    dead_letter_max: int = 100_000
    dead_letter_keep_s: int = 7 * 24 * 3600
    ca_file: str = ""
    #: The event stream (services/adapters/rabbitmq/event_stream.py): kept this long, and at most this many bytes.
    event_stream_retention_s: int = 7 * 24 * 3600
    event_stream_max_bytes: int = 5 * 1024**3
    #: Event stream watchers (WatchEvents calls) one process serves at once: each holds a channel on
    #: the process's one connection, whose channels (RabbitMQ's channel_max, 2047) its own work needs too.
    event_watchers_max: int = 256

    @property
    def url(self) -> str:
        """The first node's URL (tools that talk to one node)."""
        return self.urls[0]
