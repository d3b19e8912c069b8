"""Domain errors to gRPC statuses: the one table (services/domain/errors.py names each class's status)."""

from __future__ import annotations

import datetime as dt

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.domain import quotas
from services.domain.errors import MailQueueError


def status_of(e: MailQueueError) -> grpc.StatusCode:
    """The status a client sees for ``e``."""
    return grpc.StatusCode[e.status]


def number_of(e: MailQueueError) -> int:
    """The status code's number (as in an EnqueueManyResponse error)."""
    return status_of(e).value[0]


def details_of(e: MailQueueError) -> list[any_pb2.Any]:
    """The standard google.rpc error details of ``e`` (packed): a quota refusal's RetryInfo (how
    long to wait) and QuotaFailure (which quota: ``<kind>:<subject>`` as the subject, the limit as
    the description). Empty for every other error."""
    if not isinstance(e, quotas.QuotaExceeded):
        return []
    r = e.refusal
    retry = error_details_pb2.RetryInfo()
    retry.retry_delay.FromTimedelta(dt.timedelta(seconds=r.retry_after_s))
    failure = error_details_pb2.QuotaFailure(violations=[error_details_pb2.QuotaFailure.Violation(
        subject=f"{r.kind}:{r.subject}", description=f"{r.limit}: {r.description}")])
    packed = []
    for detail in (retry, failure):
        a = any_pb2.Any()
        a.Pack(detail)
        packed.append(a)
    return packed


def trailers_of(e: MailQueueError, message: str) -> tuple[tuple[str, bytes], ...]:
    """The ``grpc-status-details-bin`` trailer that carries ``e``'s details (none: no trailer),
    decoded by every stock client (Python grpc_status.rpc_status.from_call, Go status.FromError,
    Node @grpc/grpc-js with google-rpc status decoding, grpcurl)."""
    details = details_of(e)
    if not details:
        return ()
    status = status_pb2.Status(code=number_of(e), message=message, details=details)
    return tuple(rpc_status.to_status(status).trailing_metadata)
