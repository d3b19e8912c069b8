"""Client channels between services: balanced over every replica, re-resolved as pods come and go."""

from __future__ import annotations

import json

import grpc

#: Client-side load balancing over every address the target resolves to (headless Services).
SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
MAX_MESSAGE = 16 * 1024 * 1024


def channel_options() -> list[tuple[str, object]]:
    return [
        ("grpc.service_config", SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
    ]


def client_channel(target: str) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (e.g. ``dns:///blob:50054`` or ``127.0.0.1:50054``)."""
    return grpc.aio.insecure_channel(target, options=channel_options())


def blocking_channel(target: str) -> grpc.Channel:
    """The same, for blocking clients (mailq, tests, benchmarks)."""
    return grpc.insecure_channel(target, options=channel_options())
