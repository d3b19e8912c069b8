"""Human durations: ``90s``, ``15m``, ``1h``, ``2d`` (command lines and settings)."""

from __future__ import annotations

import datetime as dt
import re

from services.domain.errors import InvalidArgument

#: The longest duration written: 100 years (beyond, no timestamp or protobuf Duration holds it).
MAX_DURATION = dt.timedelta(days=36500)


def parse_duration(text: str) -> dt.timedelta:
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not m:
        raise InvalidArgument(f"{text!r}: use a number and a unit, e.g. 90s, 15m, 1h, 2d")
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if seconds > MAX_DURATION.total_seconds():
        raise InvalidArgument(f"{text!r} is longer than {MAX_DURATION.days}d")
    return dt.timedelta(seconds=seconds)


def human(d: dt.timedelta) -> str:
    s = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}" if s % size == 0 else f"{s / size:.1f}{unit}"
    return f"{s}s"
