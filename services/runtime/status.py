"""Domain errors to gRPC statuses: the one table (services/domain/errors.py names each class's status)."""

from __future__ import annotations

import grpc

from services.domain.errors import MailQueueError


def status_of(e: MailQueueError) -> grpc.StatusCode:
    """The status a client sees for ``e``."""
    return grpc.StatusCode[e.status]


def number_of(e: MailQueueError) -> int:
    """The status code's number (as in an EnqueueManyResponse error)."""
    return status_of(e).value[0]
