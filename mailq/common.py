"""What mailq's commands share: the client of the services, argument types, table output, the
progress line and the exit statuses."""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from google.protobuf import duration_pb2, json_format

from mailqueue.v1 import admin_pb2_grpc, blob_pb2_grpc, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2_grpc, events_pb2_grpc, webhooks_pb2_grpc
from services.adapters.grpc_channels import blocking_channel
from services.domain.delays import MAX_DELAY
from services.domain.durations import parse_duration
from services.domain.errors import InvalidArgument
from services.runtime.server_settings import DEFAULT_PORTS

#: mailq's exit statuses (``mailq --help`` and docs/pages/operating/mailq.md list them).
EXIT_OK = 0
#: A service refused or failed the call (its status and a hint on stderr), a file could not be read.
EXIT_ERROR = 1
#: The command line is wrong (argparse's status).
EXIT_USAGE = 2
#: ``mailq dequeue``: no mail came within --wait (the queue is empty, or its mails are delayed,
#: held or throttled): a script's loop ``while mailq dequeue Q; do ...; done`` ends there.
EXIT_NOTHING = 3
#: Interrupted (Ctrl-C), 128 + SIGINT as a shell reports it.
EXIT_INTERRUPTED = 130
#: The reader of the output went away (``mailq browse Q | head``), 128 + SIGPIPE as for any Unix
#: tool that a closed pipe ends.
EXIT_CLOSED_PIPE = 141


class UsageError(Exception):
    """A combination of options the parser cannot check: its message on stderr, EXIT_USAGE."""


class Client:
    def __init__(self, a: argparse.Namespace) -> None:
        token = a.token or os.environ.get("MAILQ_TOKEN", "")

        def target(name: str) -> str:
            given = getattr(a, name) or os.environ.get(f"MAILQ_{name.upper()}")
            if not given:
                return f"{a.host}:{DEFAULT_PORTS[name]}"
            host, _, port = given.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise UsageError(f"mailq: --{name} (or MAILQ_{name.upper()}) {given!r} is not HOST:PORT with a port 1 to 65535")
            return given

        tls = tls_credentials(a)
        deadline = _Deadline(getattr(a, "timeout", DEFAULT_TIMEOUT_S))
        if token and tls is None:
            remote = sorted({h for h in (target(name).rpartition(":")[0] for name in DEFAULT_PORTS) if not _loopback(h)})
            if remote:
                raise UsageError(f"mailq: a token is never sent in plaintext to {', '.join(remote)} (not this machine), "
                                 "where the services serve TLS: pass --tls-ca (or set MAILQ_TLS_CA) with the CA that "
                                 "signed their certificates")
        self.enqueue = enqueue_pb2_grpc.EnqueueServiceStub(deadline.on(blocking_channel(target("enqueue"), token, tls)))
        self.dequeue = dequeue_pb2_grpc.DequeueServiceStub(deadline.on(blocking_channel(target("dequeue"), token, tls)))
        self.browse_channel = blocking_channel(target("browse"), token, tls)
        browse_channel = deadline.on(self.browse_channel)
        self.browse = browse_pb2_grpc.BrowseServiceStub(browse_channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(browse_channel)
        self.events = events_pb2_grpc.EventServiceStub(browse_channel)
        self.webhooks = webhooks_pb2_grpc.WebhookAdminServiceStub(browse_channel)
        self.blob = blob_pb2_grpc.BlobServiceStub(deadline.on(blocking_channel(target("blob"), token, tls)))


#: A call with no end after this long fails (DEADLINE_EXCEEDED) rather than wait for ever.
DEFAULT_TIMEOUT_S = 600.0

#: The calls --timeout does not bound: the streams that show their progress (they may run long,
#: and show that they do) and the event stream (followed until Ctrl-C, --count or --for).
UNBOUNDED = frozenset({"DeleteQueue", "MoveMails", "RedriveDeadLetters", "PurgeDeadLetters", "DeleteMails", "ClearQueue",
                       "WatchEvents"})


class _Deadline(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Every call without a timeout of its own gets ``timeout_s``, but the UNBOUNDED ones (a
    browse, a dead-letter listing or an enqueue stream waited for ever on a stuck service)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    def on(self, channel: grpc.Channel) -> grpc.Channel:
        return grpc.intercept_channel(channel, self)

    def _bounded(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if details.timeout is not None or method.rpartition("/")[2] in UNBOUNDED:
            return details
        return _WithTimeout(details, self._timeout_s)

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]  # noqa: ANN001
        return continuation(self._bounded(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]  # noqa: ANN001
        return continuation(self._bounded(details), request)

    def intercept_stream_unary(self, continuation, details, requests):  # type: ignore[no-untyped-def]  # noqa: ANN001
        return continuation(self._bounded(details), requests)


class _WithTimeout(grpc.ClientCallDetails):
    def __init__(self, d: grpc.ClientCallDetails, timeout_s: float) -> None:
        self.method, self.timeout, self.credentials, self.metadata = d.method, timeout_s, d.credentials, d.metadata
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tls_credentials(a: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS when a CA is given (--tls-ca or $MAILQ_TLS_CA), with a client certificate for mutual TLS."""
    ca = a.tls_ca or os.environ.get("MAILQ_TLS_CA", "")
    cert = a.tls_cert or os.environ.get("MAILQ_TLS_CERT", "")
    key = a.tls_key or os.environ.get("MAILQ_TLS_KEY", "")
    if not ca:
        if cert or key:
            raise UsageError("mailq: --tls-cert and --tls-key need --tls-ca (the CA that signed the servers)")
        return None
    if bool(cert) != bool(key):
        raise UsageError("mailq: give both --tls-cert and --tls-key, or neither")

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise SystemExit(f"mailq: {path}: {e.strerror}") from None

    trusted = read(ca)
    if b"-----BEGIN CERTIFICATE-----" not in trusted:
        raise UsageError(f"mailq: the CA file {ca} (--tls-ca or MAILQ_TLS_CA) holds no PEM certificate: give the CA "
                         "that signed the services' certificates (make run: .stack/pki/ca.crt)")
    if not cert:
        return grpc.ssl_channel_credentials(trusted)
    chain, private = read(cert), read(key)
    if b"-----BEGIN CERTIFICATE-----" not in chain:
        raise UsageError(f"mailq: the client certificate {cert} (--tls-cert or MAILQ_TLS_CERT) holds no PEM certificate")
    if b"PRIVATE KEY-----" not in private:
        raise UsageError(f"mailq: the key {key} (--tls-key or MAILQ_TLS_KEY) holds no PEM private key")
    return grpc.ssl_channel_credentials(trusted, private, chain)


def queue_command(sub: Any, name: str, fn: Callable[[Client, argparse.Namespace], None], help: str) -> argparse.ArgumentParser:
    """The subparser of a command on one queue: its first argument is the queue; ``fn`` runs it;
    ``help`` is its line in ``mailq --help`` and in the docs' command reference."""
    s = sub.add_parser(name, help=help)
    s.add_argument("queue")
    s.set_defaults(fn=fn)
    return s


#: The largest whole number an option takes (the contract's 32-bit fields).
MAX_WHOLE = 2**31 - 1


def selector(text: str) -> str:
    """An argparse type for a condition on mails (--sender, --recipient, --name, --domain): never
    empty. An empty value (an unset shell variable) would select the mails without one, or every
    mail where empty means no condition; the null sender is written "<>"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value selects nothing you meant (an unset shell variable?): "
                                         "give a value; the null sender (bounces) is '<>'")
    return text


def queue_option(text: str) -> str:
    """An argparse type for an option naming a queue (--queue, --to): never empty. An empty value
    (an unset shell variable) would mean what leaving the option out means: every queue, or the
    default one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty queue name (an unset shell variable?): give a name, "
                                         "or leave the option out")
    return text


def whole(minimum: int = 0, maximum: int = MAX_WHOLE) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``maximum`` (a usage error otherwise,
    never a traceback from the protobuf field it fills)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{value} is out of range: {minimum} to {maximum}")
        return value
    return parse


def real(minimum: float = 0.0, maximum: float = 1e12, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from ``minimum`` (excluded with ``above``) to ``maximum``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > minimum if above else value >= minimum
        if not (math.isfinite(value) and low_ok and value <= maximum):
            low = f"more than {minimum:g}" if above else f"at least {minimum:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: {low}, at most {maximum:g}")
        return value
    return parse


def duration_arg(text: str) -> dt.timedelta:
    """parse_duration for argparse: its message on a bad value."""
    try:
        return parse_duration(text)
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_duration_arg(text: str) -> dt.timedelta:
    """duration_arg above 0s (0s was taken as "not given": a usage error, or nothing changed)."""
    d = duration_arg(text)
    if not d:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration above 0s")
    return d


def delay_arg(text: str) -> dt.timedelta:
    """duration_arg bounded as the API bounds a delay (a delivery's or a RETRY's): refused here,
    before a mail is taken and its attempt spent on an answer the server refuses."""
    d = duration_arg(text)
    if d > MAX_DELAY:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than {MAX_DELAY.days}d, the longest delay")
    return d


def duration(value: Any) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


#: C0 controls, DEL and C1 controls: shown as escapes, never sent to the terminal.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def as_json(message: Any) -> dict[str, Any]:
    """A message as --json prints it: the proto's field names, every field (a zero, an empty sender
    too: a script reads the same keys whatever the values), 64-bit numbers as numbers (the
    canonical mapping's strings sorted above every number in jq)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True,
                                     unquote_int64_if_possible=True)


def enum_text(enum: Any, value: int, prefix: str) -> str:
    """An enum value as mailq names it (its name without ``prefix``, lower case); one this mailq
    does not know (a newer server's) as its number, never a traceback."""
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return f"unknown({value})"


def shown(text: object) -> str:
    """``text`` safe for a terminal: a control character (a consumer's error text with an escape
    sequence, a multi-line SMTP reply) is written as its escape (``\\x1b``, ``\\n``), so it can
    neither rewrite the screen nor break a table's lines. JSON output needs none of this."""
    s = str(text)
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], s) if _CONTROLS.search(s) else s


def print_table(rows: list[list[str]], header: list[str]) -> None:
    rows = [[shown(c) for c in row] for row in rows]
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


class Progress:
    """One line on stderr rewritten in place as a streamed operation goes, on a terminal only:
    piped or redirected, stderr gets no progress (the result line on stdout says it all), so a
    log or ``2>&1 | ...`` never reads lines run together."""

    def __init__(self) -> None:
        self.shown = False
        self.tty = sys.stderr.isatty()

    def show(self, text: str) -> None:
        if self.tty:
            print(f"\r{text}\x1b[K", end="", file=sys.stderr, flush=True)
            self.shown = True

    def end(self) -> None:
        """End the line (when one was shown): what is printed next starts on a line of its own."""
        if self.shown:
            print(file=sys.stderr, flush=True)
            self.shown = False


#: A stream that ended with one of these after it began was cut, not refused (a refusal such as
#: DeleteQueue's "mail arrived meanwhile" comes after its first message too, and running it again
#: would not help): the operator is told how to complete it.
_CUT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


def follow(stream: Iterable[Any], progress: Callable[[Any], str], interrupted: str) -> Any:
    """Show a streamed operation's progress (``Progress``); its last message, which must be done.
    Cut short once it began and before it was done (Ctrl-C, a service restarted, a lost
    connection), it says on stderr how to complete it (``interrupted``) before the error's own line
    and exit status: a DeleteQueue cut there left its queue unlisted and refusing mail, and only
    "UNAVAILABLE" said so."""
    last = None
    line = Progress()
    try:
        for r in stream:
            last = r
            line.show(progress(r))
    except (KeyboardInterrupt, grpc.RpcError) as e:
        line.end()
        cut = isinstance(e, KeyboardInterrupt) or (last is not None and e.code() in _CUT)
        if cut and not (last is not None and last.done):
            print(interrupted, file=sys.stderr, flush=True)
        raise
    finally:
        line.end()
    if last is None or not last.done:
        raise SystemExit(interrupted)
    return last
