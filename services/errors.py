"""The error hierarchy of the domain.

Adapters convert driver exceptions into these at their boundary (``raise BackendUnavailable(...)
from e``); the server runtime maps each class to one gRPC status code. No pika, Cassandra or
MinIO exception type ever reaches a servicer.
"""

from __future__ import annotations

import grpc


class MailQueueError(Exception):
    """Base class. ``code`` is the gRPC status a client sees."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(MailQueueError):
    """The request itself is malformed; retrying it unchanged cannot succeed."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MailQueueError):
    """A named queue, blob or mail does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MailQueueError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(MailQueueError):
    """The system is not in a state the request needs (e.g. a configuration rule)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(MailQueueError):
    """A size or count limit is exceeded."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Aborted(MailQueueError):
    """A concurrent operation conflicts (e.g. the same idempotency key in flight): retry later."""

    code = grpc.StatusCode.ABORTED


class Unauthenticated(MailQueueError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(MailQueueError):
    code = grpc.StatusCode.PERMISSION_DENIED


class BackendUnavailable(MailQueueError):
    """Cassandra, RabbitMQ or MinIO did not answer: retryable, nothing acknowledged."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend} unavailable: {detail}; the request was not applied, retry it")
        self.backend = backend


class ConfigurationError(Exception):
    """A configuration (environment or stored) breaks a rule: the service refuses to start."""
