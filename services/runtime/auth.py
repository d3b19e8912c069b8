"""Access control: bearer tokens with roles, checked once per RPC by an interceptor.

Roles: ``producer`` (enqueue, blob put), ``consumer`` (dequeue, blob get), ``reader`` (browse,
blob get), ``admin`` (everything). Health and reflection stay open (Kubernetes probes, grpcurl).
Without tokens every RPC is allowed, and the server refuses to listen beyond loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from services.domain.errors import ConfigurationError

log = logging.getLogger(__name__)


#: Who may call what (admin may call everything). Longest matching prefix wins.
PERMISSIONS: dict[str, frozenset[str]] = {
    "/mailqueue.v1.EnqueueService/": frozenset({"producer"}),
    "/mailqueue.v1.DequeueService/": frozenset({"consumer"}),
    "/mailqueue.v1.BrowseService/": frozenset({"reader"}),
    "/mailqueue.v1.AdminService/": frozenset(),
    "/mailqueue.v1.BlobService/Put": frozenset({"producer"}),  # and PutBytes
    "/mailqueue.v1.BlobService/Get": frozenset({"consumer", "reader"}),  # and GetBytes
    "/mailqueue.v1.BlobService/Stat": frozenset({"producer", "consumer", "reader"}),
    "/mailqueue.v1.BlobService/Delete": frozenset(),
}
PUBLIC = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def allowed(method: str, role: str) -> bool:
    if role == "admin" or method.startswith(PUBLIC):
        return True
    matches = [prefix for prefix in PERMISSIONS if method.startswith(prefix)]
    if not matches:
        return False
    return role in PERMISSIONS[max(matches, key=len)]


def role_of(tokens: Mapping[str, str], metadata: Any) -> str | None:
    header = dict(metadata or ()).get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return None
    role = None
    for token, r in tokens.items():  # compare with every token, in constant time each
        if hmac.compare_digest(token.encode(), presented.encode()):
            role = r
    return role


def check_exposure(host: str, tokens: Mapping[str, str]) -> None:
    """Refuse a non-loopback listener without tokens; warn on a loopback one."""
    if tokens:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigurationError(
            f"refusing to listen on {host} without access control: set MAILQUEUE_TOKENS "
            "(role:token,...) or listen on 127.0.0.1"
        )
    log.warning("no MAILQUEUE_TOKENS set: every RPC is allowed (listening on loopback only)")


def _ignore(_data: bytes) -> None:
    """A denied call's body is never parsed: an undecodable one is denied like any other."""
    return None


def _deny(code: grpc.StatusCode, message: str) -> Callable[..., Awaitable[None]]:
    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return deny


def _deny_stream(code: grpc.StatusCode, message: str) -> Callable[..., AsyncIterator[Any]]:
    """For server-streaming methods: an async generator that aborts before yielding anything
    (a coroutine handler on a streaming method can end in INTERNAL when the client half-closes)."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    return deny


class TokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = dict(tokens)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not self._tokens or details.method.startswith(PUBLIC):
            return handler
        role = role_of(self._tokens, details.invocation_metadata)
        if role is None:
            code, message = grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token (metadata 'authorization: Bearer <token>')"
        elif not allowed(details.method, role):
            code, message = grpc.StatusCode.PERMISSION_DENIED, f"role {role!r} may not call {details.method}"
        else:
            return handler
        encode = handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_deny(code, message), _ignore, encode)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_deny_stream(code, message), _ignore, encode)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_deny(code, message), _ignore, encode)
        return grpc.stream_stream_rpc_method_handler(_deny_stream(code, message), _ignore, encode)
