"""Access control: bearer tokens with roles, checked once per RPC by an interceptor; with mutual
TLS, a client certificate's identity may give the role instead (MAILQUEUE_TLS_IDENTITIES).

Roles: ``producer`` (enqueue, blob put), ``consumer`` (dequeue, blob get), ``reader`` (browse,
blob get), ``admin`` (everything). Health and reflection stay open (Kubernetes probes, grpcurl).
A token, when presented, decides; without one, the certificate's identity does. Without tokens
or identities every RPC is allowed, and the server refuses to listen beyond loopback.

The interceptor also says who the caller is, for the events its call records
(services/domain/events.py ``current_actor``): its role and identity ("token:" and the first 12
hex digits of the SHA-256 of its token, or its certificate's identity; "anonymous" without access
control). The actor is set inside the call's handler, in the RPC's own task, so the servicer and
every task it starts see it.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from services.domain import events, quotas
from services.domain.errors import ConfigurationError
from services.runtime.interceptors import RPCS
from services.runtime.settings import token_digest
from services.runtime.tls import peer_identity, peer_match, peer_role

log = logging.getLogger(__name__)


#: Who may call what (admin may call everything). Longest matching prefix wins.
PERMISSIONS: dict[str, frozenset[str]] = {
    "/mailqueue.v1.EnqueueService/": frozenset({"producer"}),
    "/mailqueue.v1.DequeueService/": frozenset({"consumer"}),
    "/mailqueue.v1.BrowseService/": frozenset({"reader"}),
    "/mailqueue.v1.AdminService/": frozenset(),
    "/mailqueue.v1.EventService/": frozenset({"reader"}),
    "/mailqueue.v1.WebhookAdminService/": frozenset(),  # admin only: it says where events go
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


def _presented(metadata: Any) -> str:
    """The bearer token of a call's metadata ("" without one)."""
    header = dict(metadata or ()).get("authorization", "")
    scheme, _, presented = header.partition(" ")
    return presented if scheme.lower() == "bearer" else ""


def token_actor(digest: str, role: str) -> events.Actor:
    """A caller known by its token: never the token itself, the first 12 hex digits of its SHA-256."""
    return events.Actor("caller", role, "token:" + digest[:12])


def role_of(tokens: Mapping[str, str], metadata: Any) -> str | None:
    """The role of the call's bearer token; ``tokens`` maps each token's hex SHA-256 to its role
    (services/runtime/settings.py ``parse_tokens``)."""
    presented = _presented(metadata)
    if not presented:
        return None
    return _role_of_digest(tokens, token_digest(presented))


def _role_of_digest(tokens: Mapping[str, str], digest: str) -> str | None:
    role = None
    for known, r in tokens.items():  # compare with every digest, in constant time each
        if hmac.compare_digest(known, digest):
            role = r
    return role


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(host: str, tls_serving: bool, plaintext: bool) -> None:
    """TLS by default: plaintext only by MAILQUEUE_PLAINTEXT=true, and only on a loopback host."""
    if tls_serving:
        if plaintext:
            raise ConfigurationError("MAILQUEUE_PLAINTEXT=true and a TLS certificate are both set: choose one")
        return
    if not plaintext:
        raise ConfigurationError(
            "no TLS certificate: set MAILQUEUE_TLS_CERT_FILE and MAILQUEUE_TLS_KEY_FILE (stack/pki.sh makes a local CA "
            "and certificates; make run uses them), or MAILQUEUE_PLAINTEXT=true to serve in the clear on loopback"
        )
    if not is_loopback(host):
        raise ConfigurationError(
            f"MAILQUEUE_PLAINTEXT=true is for loopback only, and this server listens on {host}: "
            "serve TLS (MAILQUEUE_TLS_CERT_FILE, MAILQUEUE_TLS_KEY_FILE)"
        )
    log.warning("serving gRPC in the clear (MAILQUEUE_PLAINTEXT=true, loopback only)")


def check_exposure(host: str, tokens: Mapping[str, str], identities: Mapping[str, str] | None = None) -> None:
    """Refuse a non-loopback listener without tokens or certificate identities; warn on a loopback one."""
    if tokens or identities:
        return
    if not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host} without access control: set MAILQUEUE_TOKENS "
            "(role:token,...) or listen on 127.0.0.1"
        )
    log.warning("no MAILQUEUE_TOKENS set: every RPC is allowed (listening on loopback only)")


def _ignore(_data: bytes) -> None:
    """A denied call's body is never parsed: an undecodable one is denied like any other."""
    return None


def _refused(method: str, code: grpc.StatusCode) -> None:
    """A call refused here never reaches the metrics interceptor (it wraps the handler this one
    replaces): counted with the others in mailqueue_rpc_total."""
    RPCS.labels(method, code.name).inc()


def _deny(code: grpc.StatusCode, message: str, method: str) -> Callable[..., Awaitable[None]]:
    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        _refused(method, code)
        await context.abort(code, message)

    return deny


def _deny_stream(code: grpc.StatusCode, message: str, method: str) -> Callable[..., AsyncIterator[Any]]:
    """For server-streaming methods: an async generator that aborts before yielding anything
    (a coroutine handler on a streaming method can end in INTERNAL when the client half-closes)."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        _refused(method, code)
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    return deny


class TokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: Mapping[str, str], identities: Mapping[str, str] | None = None) -> None:
        self._tokens = dict(tokens)
        self._identities = dict(identities or {})

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not (self._tokens or self._identities) or details.method.startswith(PUBLIC):
            return handler
        presented = _presented(details.invocation_metadata)
        digest = token_digest(presented) if presented else ""
        role, tenant = _tenant_of(_role_of_digest(self._tokens, digest) if presented else None)
        if role is None and self._identities and not presented:
            # No token: the client certificate decides, seen only from the call's context. A
            # token presented decides instead, and an unknown one is refused (never the
            # certificate's role in place of a revoked or mistyped token).
            return _checked_by_certificate(handler, details.method, self._identities)
        denied = _denial(details.method, role)
        if denied is not None:
            return _denying(handler, *denied, details.method)
        assert role is not None
        actor = token_actor(digest, role)

        async def admit(_context: grpc.aio.ServicerContext) -> tuple[events.Actor, str]:
            return actor, tenant or actor.identity

        return _acting(handler, admit)


def _tenant_of(value: str | None) -> tuple[str | None, str]:
    """A token's or identity's ``role`` or ``role@tenant`` -> (role, tenant or "")."""
    if value is None:
        return None, ""
    role, _, tenant = value.partition("@")
    return role, tenant


def _denial(method: str, role: str | None) -> tuple[grpc.StatusCode, str] | None:
    if role is None:
        return grpc.StatusCode.UNAUTHENTICATED, "missing or unknown bearer token (metadata 'authorization: Bearer <token>')"
    if not allowed(method, role):
        return grpc.StatusCode.PERMISSION_DENIED, f"role {role!r} may not call {method}"
    return None


def _denying(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str, method: str) -> grpc.RpcMethodHandler:
    encode = handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(_deny(code, message, method), _ignore, encode)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(_deny_stream(code, message, method), _ignore, encode)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(_deny(code, message, method), _ignore, encode)
    return grpc.stream_stream_rpc_method_handler(_deny_stream(code, message, method), _ignore, encode)


Admit = Callable[[grpc.aio.ServicerContext], Awaitable[tuple[events.Actor, str]]]


def _enter(actor_and_tenant: tuple[events.Actor, str]) -> None:
    actor, tenant = actor_and_tenant
    events.current_actor.set(actor)
    quotas.current_tenant.set(tenant)


def _acting(handler: grpc.RpcMethodHandler, admit: Admit) -> grpc.RpcMethodHandler:
    """``handler`` behind ``admit``, awaited when the call starts: it aborts the call (a denial), or
    names the caller and its tenant, set as ``events.current_actor`` and ``quotas.current_tenant``
    inside the call's own context (a value set in intercept_service would not be the handler's for
    sure). The tenant is the one its token or certificate names (``role@tenant``), else its identity."""

    def unary(inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            _enter(await admit(context))
            return await inner(request, context)
        return call

    def streaming(inner: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            _enter(await admit(context))
            async with contextlib.aclosing(inner(request, context)) as responses:  # closed with this one (grpc never closes it)
                async for response in responses:
                    yield response
        return call

    decode, encode = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), decode, encode)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), decode, encode)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), decode, encode)
    return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), decode, encode)


def _checked_by_certificate(handler: grpc.RpcMethodHandler, method: str, identities: Mapping[str, str]) -> grpc.RpcMethodHandler:
    """``handler`` behind a check of the client certificate's role, made when the call starts."""
    def denial(context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
        role = _tenant_of(peer_role(context, identities))[0]
        if role is None:
            identity = peer_identity(context)
            if identity is not None:
                # Authenticated by its certificate, but given no role: known, and not allowed.
                return grpc.StatusCode.PERMISSION_DENIED, (f"the client certificate's identity {identity!r} has no role: "
                                                           "map it in MAILQUEUE_TLS_IDENTITIES (identity=role)")
            return grpc.StatusCode.UNAUTHENTICATED, ("no bearer token, and no client certificate whose identity "
                                                     "MAILQUEUE_TLS_IDENTITIES names")
        return _denial(method, role)

    async def admit(context: grpc.aio.ServicerContext) -> tuple[events.Actor, str]:
        denied = denial(context)
        if denied is not None:
            _refused(method, denied[0])
            await context.abort(*denied)
        actor = _certificate_actor(context, identities)
        return actor, _tenant_of(peer_role(context, identities))[1] or actor.identity

    return _acting(handler, admit)


def _certificate_actor(context: grpc.aio.ServicerContext, identities: Mapping[str, str]) -> events.Actor:
    """The caller by its certificate: the identity MAILQUEUE_TLS_IDENTITIES maps (the one its role
    and, without a ``role@tenant``, its tenant come from), else its first identity."""
    match = peer_match(context, identities)
    if match is None:
        return events.Actor("caller", "", peer_identity(context) or "anonymous")
    return events.Actor("caller", _tenant_of(match[1])[0] or "", match[0])
