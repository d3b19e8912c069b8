"""The delay ladder: any delay up to two years with a fixed set of RabbitMQ wait queues, no polling.

Level ``k`` of the ladder is a topic exchange and a wait queue whose messages expire after
``2**k`` units (``UNIT``) and are dead-lettered to level ``k - 1`` (level 0: to the delivery
exchange). A delay of ``n`` units is routed with the binary digits of ``n`` as the first
``LEVELS`` words of the routing key (most significant first), then the queue name: each level
sends the message through its wait queue when its digit is 1, and on to the next level when it
is 0. The delivery exchange routes by the queue name to the work queue. So a message waits
exactly ``n`` units in total, through at most ``LEVELS`` queues, and nothing in our processes
keeps a timer. (The NServiceBus RabbitMQ transport routes delays the same way.)

Pure functions, unit-tested; the declarations are in services/adapters/rabbitmq/topology.py.
"""

from __future__ import annotations

import datetime as dt
import math

#: One step of the ladder: the rounding of every delay (always up, never early).
UNIT = dt.timedelta(milliseconds=250)
#: Levels: the longest delay is (2**LEVELS - 1) units, about 776 days.
LEVELS = 28
#: The longest delay a client may ask for.
MAX_DELAY = dt.timedelta(days=366)


def units(delay: dt.timedelta) -> int:
    """Whole units to wait, rounded up (a mail is never early); 0 for no or a negative delay."""
    if delay <= dt.timedelta(0):
        return 0
    n = math.ceil(delay / UNIT)
    if n >= 2**LEVELS:
        raise ValueError(f"delay {delay} is beyond the ladder's {(2**LEVELS - 1) * UNIT}")
    return n


def routing_key(n: int, queue: str, priority: str = "normal") -> str:
    """``n``'s binary digits, most significant first, as LEVELS words, then the queue name (and
    for high and low, a last word ``~class``: "~" is not allowed in queue names)."""
    return ".".join(format(n, f"0{LEVELS}b")) + "." + queue + _class_word(priority)


def _class_word(priority: str) -> str:
    return "" if priority == "normal" else f".~{priority}"


def entry_level(n: int) -> int:
    """The level to publish a delay of ``n`` units to: its highest 1 digit (fewer hops)."""
    return max(n.bit_length() - 1, 0)


def level_binding(level: int, digit: str) -> str:
    """The binding key of ``level`` that matches routing keys whose digit for it is ``digit``."""
    return "*." * (LEVELS - 1 - level) + digit + ".#"


def delivery_binding(queue: str, priority: str = "normal") -> str:
    """The delivery exchange's binding for ``queue``'s class: any digits, then exactly the queue name."""
    return "*." * LEVELS + queue + _class_word(priority)


def ttl_ms(level: int) -> int:
    """How long a message waits in the wait queue of ``level``."""
    return int(UNIT / dt.timedelta(milliseconds=1)) * 2**level
