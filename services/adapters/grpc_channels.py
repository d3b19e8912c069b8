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


def client_channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (e.g. ``dns:///blob:50054`` or ``127.0.0.1:50054``); TLS with ``credentials``."""
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=channel_options())
    return grpc.aio.insecure_channel(target, options=channel_options())


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata presenting ``token`` (none when empty)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def blocking_channel(target: str, token: str = "", credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """The same, for blocking clients (mailq, tests, benchmarks)."""
    if credentials is not None:
        channel = grpc.secure_channel(target, credentials, options=channel_options())
    else:
        channel = grpc.insecure_channel(target, options=channel_options())
    return grpc.intercept_channel(channel, _SyncBearer(token)) if token else channel


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: grpc.ClientCallDetails, header: tuple[str, str]) -> None:
        self.method, self.timeout, self.credentials = d.method, d.timeout, d.credentials
        self.metadata = tuple(d.metadata or ()) + (header,)
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(_Details(details, self._header), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return continuation(_Details(details, self._header), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(_Details(details, self._header), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(_Details(details, self._header), request_iterator)
