"""What mailq's commands share: argument types and table output."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from google.protobuf import duration_pb2

from services.domain.durations import parse_duration
from services.domain.errors import InvalidArgument


def duration_arg(text: str) -> dt.timedelta:
    """parse_duration for argparse: its message on a bad value."""
    try:
        return parse_duration(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def duration(value: Any) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
