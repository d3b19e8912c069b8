"""Cross-cutting concerns, applied once to every RPC: error mapping and metrics.

Domain errors become their gRPC status with their message; anything else is logged with its
stack trace and answered INTERNAL without one. A client never sees UNKNOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from services.domain import quotas
from services.domain.errors import InvalidArgument, MailQueueError
from services.runtime.status import status_of, trailers_of

log = logging.getLogger(__name__)

RPCS = Counter("mailqueue_rpc_total", "RPCs handled, by method and status code", ["method", "code"])
LATENCY = Histogram(
    "mailqueue_rpc_seconds", "RPC handling time (streams: until the stream ends)", ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


#: Longest status message sent (gRPC metadata is limited to 8 KiB).
MAX_DETAIL = 2000


class Undecodable:
    """What a request that is not a valid protobuf message deserializes to (see ``tolerant``)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns Undecodable instead of raising: the handler answers
    INVALID_ARGUMENT (gRPC itself would answer UNKNOWN or INTERNAL)."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # noqa: BLE001 - DecodeError, or any other parse failure
            return Undecodable(e)

    return deserialize


def _decoded(request: Any) -> Any:
    if isinstance(request, Undecodable):
        raise InvalidArgument(f"the request is not a valid protobuf message of this method ({str(request.error)[:200]})")
    return request


async def _decoded_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _decoded(request)


def _checked(request: Any) -> Any:
    """A unary request checked now, or a request stream checked message by message."""
    if hasattr(request, "__aiter__"):
        return _decoded_stream(request)
    return _decoded(request)


async def _fail(context: grpc.aio.ServicerContext, method: str, e: BaseException) -> None:
    if isinstance(e, NotImplementedError):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
    if isinstance(e, MailQueueError):
        # A quota refusal is counted (mailqueue_quota_refused_total), not logged: a tenant over its
        # rate may be refused thousands of times a second.
        if not isinstance(e, quotas.QuotaExceeded):
            log.info("rpc refused", extra={"method": method, "code": e.status, "reason": str(e)})
        detail = str(e)
        detail = detail if len(detail) <= MAX_DETAIL else detail[:MAX_DETAIL] + "..."
        await context.abort(status_of(e), detail, trailers_of(e, detail))
    log.exception("rpc failed", extra={"method": method})
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; the server log has the details")


#: The server's deadline runs from the request's arrival, a little after the client's: a client
#: cancelling at its own deadline reaches the server that much before the server's.
DEADLINE_SLACK_S = 0.1


def _code(context: grpc.aio.ServicerContext, cancelled: bool = False) -> str:
    """The call's status as the client saw it: a handler cancelled (the client left, or its
    deadline passed) has no code of its own and is not OK."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if not cancelled:
        return "OK"
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= DEADLINE_SLACK_S else "CANCELLED"


def _unary(method: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        start, cancelled = time.perf_counter(), False
        try:
            return await fn(_checked(request), context)
        except (grpc.aio.AbortError, GeneratorExit):
            raise
        except asyncio.CancelledError:
            cancelled = True
            raise
        except Exception as e:  # noqa: BLE001 - the boundary where every error gets a status
            await _fail(context, method, e)
        finally:
            LATENCY.labels(method).observe(time.perf_counter() - start)
            RPCS.labels(method, _code(context, cancelled)).inc()

    return handler


def _streaming(method: str, fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        start, cancelled = time.perf_counter(), False
        try:
            result = fn(_checked(request), context)
            if hasattr(result, "__aiter__"):
                async with contextlib.aclosing(result) if hasattr(result, "aclose") else contextlib.nullcontext():
                    # closed with this one: grpc never closes a handler's generator, the collector would, later
                    async for response in result:
                        yield response
            else:  # a handler that writes with context.write() and returns
                await result
        except GeneratorExit:
            cancelled = True  # closed by grpc: the client went away or its deadline passed
            raise
        except grpc.aio.AbortError:
            raise
        except asyncio.CancelledError:
            cancelled = True
            raise
        except Exception as e:  # noqa: BLE001
            await _fail(context, method, e)
        finally:
            LATENCY.labels(method).observe(time.perf_counter() - start)
            RPCS.labels(method, _code(context, cancelled)).inc()

    return handler


class ErrorsAndMetrics(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        decode, encode = tolerant(handler.request_deserializer), handler.response_serializer
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_unary(method, handler.unary_unary), decode, encode)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_unary(method, handler.stream_unary), decode, encode)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_streaming(method, handler.unary_stream), decode, encode)
        return grpc.stream_stream_rpc_method_handler(_streaming(method, handler.stream_stream), decode, encode)
