"""W3C trace context (https://www.w3.org/TR/trace-context/) carried across the queue.

A producer gives a ``traceparent`` on Enqueue (gRPC metadata); the queue keeps it with the mail
(QueuedMail.traceparent: the view row and the broker message), hands it to the consumer with each
Delivery, and writes it on the mail's events, so that the consumer continues the producer's trace.

Only version ``00`` is accepted, in its exact form ``00-<32 hex trace id>-<16 hex parent id>-<2 hex
flags>`` (lower case, ids not all zeros): anything else is refused with INVALID_ARGUMENT (the call
writes nothing), not silently dropped: a producer that sends a trace context wants it carried, and
a silently lost one is found only when the trace breaks (docs/pages/reference/errors.md).

The value of the call being served is held in ``current_traceparent`` (set by the servicer for the
whole call, like ``events.current_actor``): every mail the call enqueues carries it.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterable, Iterator

from services.domain.errors import InvalidArgument

#: The gRPC metadata key (W3C: the HTTP header's name, lower case as gRPC metadata keys are).
METADATA_KEY = "traceparent"

_FORMAT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")

#: The traceparent of the call being served ("" when it gave none).
current_traceparent: contextvars.ContextVar[str] = contextvars.ContextVar("mailqueue_traceparent", default="")


def parse(value: str) -> str:
    """``value`` when it is a valid version-00 traceparent ("" stays ""); else InvalidArgument."""
    if not value:
        return ""
    m = _FORMAT.fullmatch(value)
    if m is None or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        raise InvalidArgument(
            f"traceparent {value[:80]!r} is malformed: send 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags> "
            "(W3C trace context, lower case, ids not all zeros), or no traceparent metadata")
    return value


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The validated traceparent of a call's metadata (key, value pairs), "" when absent.
    Given twice: InvalidArgument (which one to carry would be a guess)."""
    values = [v for k, v in (metadata or ()) if k.lower() == METADATA_KEY]
    if len(values) > 1:
        raise InvalidArgument("traceparent is given more than once: send one")
    if not values:
        return ""
    value = values[0]
    return parse(value if isinstance(value, str) else value.decode("ascii", "replace"))


@contextlib.contextmanager
def carrying(traceparent: str) -> Iterator[None]:
    """Mails enqueued inside carry ``traceparent``."""
    token = current_traceparent.set(traceparent)
    try:
        yield
    finally:
        current_traceparent.reset(token)
