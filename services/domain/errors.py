"""The error hierarchy of the domain.

Adapters convert driver exceptions into these at their boundary (``raise BackendUnavailable(...)
from e``); the server runtime maps each class's ``status`` (a gRPC status code's name) to the
status a client sees (services/runtime/status.py). No pika, Cassandra or MinIO exception type
ever reaches a servicer, and no gRPC type is imported here: the Spark sweep uses these errors.
"""

from __future__ import annotations


class MailQueueError(Exception):
    """Base class. ``status`` names the gRPC status a client sees."""

    status: str = "INTERNAL"


class InvalidArgument(MailQueueError):
    """The request itself is malformed; retrying it unchanged cannot succeed."""

    status = "INVALID_ARGUMENT"


class NotFound(MailQueueError):
    """A named queue, blob or mail does not exist."""

    status = "NOT_FOUND"


class FailedPrecondition(MailQueueError):
    """The system is not in a state the request needs (e.g. a configuration rule)."""

    status = "FAILED_PRECONDITION"


class ResourceExhausted(MailQueueError):
    """A size or count limit is exceeded."""

    status = "RESOURCE_EXHAUSTED"


class OutOfRange(MailQueueError):
    """A position past the end of what exists (an event stream cursor beyond the stream's last event)."""

    status = "OUT_OF_RANGE"


class Aborted(MailQueueError):
    """A concurrent operation conflicts (e.g. the same idempotency key in flight): retry later."""

    status = "ABORTED"


class Rebalanced(MailQueueError):
    """A long-lived call ended by the server so that its client may reach another replica (a
    WatchEvents past the connection age): resume it (from the last cursor), nothing was lost."""

    status = "UNAVAILABLE"


class BackendUnavailable(MailQueueError):
    """Cassandra, RabbitMQ or MinIO did not answer: retryable, nothing acknowledged."""

    status = "UNAVAILABLE"

    def __init__(self, backend: str, detail: str) -> None:
        super().__init__(f"{backend} unavailable: {detail}; the request was not applied, retry it")
        self.backend = backend
        self.detail = detail


class CredentialsRefused(BackendUnavailable):
    """A backend answers but refuses this process's own credentials: retryable for the caller, and
    for the operator a setting to fix (it does not heal by waiting), so it fails readiness."""


class PublishersBlocked(BackendUnavailable):
    """The broker blocks publishers for now (RabbitMQ's memory or disk alarm): it would not confirm
    a publish before the alarm is lifted. Retryable. Enqueue raises it before writing anything; a
    publish already waiting for its confirm when the block began fails with it at once."""

    def __init__(self, reason: str) -> None:
        super().__init__("rabbitmq", f"it blocks publishers, {reason} (a resource alarm: operators free memory or "
                                     "disk on its nodes)")
        self.reason = reason


class ConfigurationError(Exception):
    """A configuration (environment or stored) breaks a rule: the service refuses to start."""


# --- webhook registrations (WebhookAdminService) ---
class AlreadyExists(MailQueueError):
    """What the request creates exists already under that name (a webhook endpoint)."""

    status = "ALREADY_EXISTS"
