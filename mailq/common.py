"""What mailq's commands share: argument types and table output."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Iterable
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


def follow(stream: Iterable[Any], progress: Callable[[Any], str], interrupted: str) -> Any:
    """Show a streamed operation's progress on one stderr line; its last message, which must be done."""
    last = None
    for r in stream:
        last = r
        print(f"\r{progress(r)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if last is None or not last.done:
        raise SystemExit(interrupted)
    return last
