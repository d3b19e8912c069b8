"""The delivery tags a Dequeue stream gives its client: the broker's tag, with the stream's own
prefix above it.

RabbitMQ numbers each channel's deliveries 1, 2, 3, ... and every stream has a channel of its
own, so two streams hand out the same numbers. A client that answers a tag on the wrong stream
would settle that stream's delivery of the same number: a SUCCESS for a mail nobody processed.
With a random prefix per stream, an answer on the wrong stream is refused (INVALID_ARGUMENT)
but for a 1 in 65,535 chance. Tags stay below 2^52: exact in a JavaScript number too.
"""

from __future__ import annotations

import secrets

#: Bits of the broker's tag (68 billion deliveries on one channel).
BROKER_BITS = 36
_BROKER_MASK = (1 << BROKER_BITS) - 1
#: Prefixes are 1 .. 2^16 - 1: never 0, so a tag of another stream never passes for one of ours.
PREFIXES = (1 << 16) - 1


def new_prefix() -> int:
    return 1 + secrets.randbelow(PREFIXES)


def outward(prefix: int, broker_tag: int) -> int:
    """The tag the client sees for the broker's ``broker_tag``."""
    return prefix << BROKER_BITS | (broker_tag & _BROKER_MASK)


def inward(prefix: int, client_tag: int) -> int | None:
    """The broker's tag of a tag this stream gave out; None for a tag it did not."""
    if client_tag >> BROKER_BITS != prefix:
        return None
    return client_tag & _BROKER_MASK
