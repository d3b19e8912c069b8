"""mailq: see and manage every queue of a cluster from one place.

    mailq queues                         list queues
    mailq show Q                         size (ready, delayed), oldest mail, retry policy, configuration
    mailq browse Q [--sender S] [--recipient R] [--name N] [--id ID] [--ready | --delayed] [--limit N] [--json]
                   [--page-size N] [--page-token T]
    mailq size Q [--exact]               from the queue's counters (cheap) or by reading every live mail
    mailq shape Q [--top 20]             Postfix qshape: recipient domain x age buckets (minutes), then
                                         each shaped destination: in flight, delivered/s, waiting, limits
    mailq reconcile Q                    rewrite the queue's counters from an exact count
    mailq drop Q [--force]               delete a queue (with its live mails and dead letters: --force)
    mailq create Q [--initial-backoff 1m] [--multiplier 2] [--max-backoff 1h] [--max-attempts 20] [--max-age 5d]
    mailq retry-policy Q [--initial-backoff 1m] [--multiplier 2] [--max-backoff 1h] [--max-attempts 20] [--max-age 5d]
    mailq delete Q (--sender S | --recipient R | --name N | --id ID [ID ...])
    mailq clear Q --force
    mailq flush Q [--sender S | --recipient R | --domain D | --name N]
    mailq republish Q --older-than 1h
    mailq move Q TO [--sender S] [--recipient R] [--name N] [--id ID [ID ...]] [--ready | --delayed] [--limit N]
    mailq config get | config set [--slice-window 1h] [--buckets N] [--pace N]
    mailq hold|bounce [--queue Q] [--domain D] [--sender S] [--name N] [--for 1d] [--reason R]
    mailq rules                          the hold and bounce rules in force
    mailq release RULE_ID                lift a rule (held mails go out now, in order)
    mailq throttle set DEST [--queue Q] [--rate 20/s] [--concurrency 5]   limit a destination (domain or site)
    mailq throttle clear DEST [--queue Q] | list [--queue Q] | resume DEST
    mailq throttle site NAME DOMAIN... | drop-site NAME
    mailq throttle rule ID --pattern RE --threshold 3 --window 5m (--suspend | --slow 1/s) --for 10m | drop-rule ID
    mailq quota set KIND SUBJECT [--mails-per-s 20 --burst-mails 40] [--bytes-per-s B --burst-bytes B] [--max-queued N] [--max-queued-bytes B]
                    [--exempt-bounces] [--exempt-sender A ...]   KIND: tenant, sender, sender-domain, queue
    mailq quota clear KIND SUBJECT | list [--kind KIND]     over a quota Enqueue answers RESOURCE_EXHAUSTED
    mailq dead list Q [--reason expired ...] [--sender S] [--recipient R] [--name N] [--limit N] [--json]
                      [--page-size N] [--page-token T]
    mailq dead count Q [--exact]         dead letters by reason
    mailq dead redrive Q [--to T] [--rate 100] [--keep-attempts] [--limit N] [filters]   back to a queue, N/s
    mailq dead purge Q (--older-than 7d | filters | --all)
    mailq enqueue Q FILE.eml --from A --to B [--to C] [--name N] [--delay 10m] [--priority high|normal|low]
    mailq dequeue Q [-n N] [--ack success|retry|reject] [--retry-after 5m] [--out DIR] [--wait 10]
    mailq trace ID [--queue Q] | trace --name N [--json]   what happened to a mail: its events, times and actors
    mailq events [--cursor C | --oldest] [--queue Q ...] [--type T ...] [--count N] [--for S] [--json]
                                         follow the event stream as it happens (resumable from a cursor)
    mailq webhook add NAME URL --secret-file PATH [--events TYPE...] [--queues Q...] [--max-age-s N] [--from-oldest]
    mailq webhook list | webhook remove NAME   the endpoints webhook_svc delivers events to

An ID is a full enqueue id or a unique prefix of one (at least 4 characters), as `mailq browse` prints it.

Targets: --target/--host (default localhost, services on their default ports) or --enqueue / --dequeue /
--browse / --blob HOST:PORT; --token (or MAILQ_TOKEN) for a cluster with access control.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from mailq import dead, mails, queues, quota, rules, throttle, trace, transfer, webhook
from mailq.common import DEFAULT_TIMEOUT_S, EXIT_CLOSED_PIPE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Client, UsageError, real
from services.runtime.server_settings import DEFAULT_PORTS

EPILOG = """\
Output: results on stdout; errors, hints and the progress of long operations on stderr (the progress
line on a terminal only).

Exit status:
  0    done
  1    error: a service refused or failed the call (its status and a hint on stderr), a file unreadable
  2    usage: the command line is wrong (an unknown option, a missing one, options that exclude each other)
  3    dequeue: no mail came within --wait (empty queue, or its mails delayed, held or throttled)
  130  interrupted (Ctrl-C)
  141  the reader of the output went away (mailq browse Q | head), as for any Unix tool
"""

HINTS = {
    grpc.StatusCode.UNAVAILABLE: "is the service up and reachable? (`make run` locally; check --host / the target flags). "
                                 "The services serve TLS by default: pass --tls-ca (make run: .stack/pki/ca.crt) or set MAILQ_TLS_CA",
    grpc.StatusCode.UNAUTHENTICATED: "pass --token or set MAILQ_TOKEN",
    grpc.StatusCode.PERMISSION_DENIED: "this token's role may not do that; use an admin token",
    grpc.StatusCode.NOT_FOUND: "check the name (`mailq queues` lists queues)",
    grpc.StatusCode.UNIMPLEMENTED: "the server is older than this mailq",
    grpc.StatusCode.DEADLINE_EXCEEDED: "no answer within --timeout (default 600 s): is the service overloaded or stuck? "
                                       "(mailq size/show --exact and flush on a deep queue may need a longer --timeout)",
}

#: NOT_FOUND from a command whose subject is not a queue: where its names are listed.
NOT_FOUND_HINTS = {
    "webhook": "check the name (`mailq webhook list` lists the endpoints)",
    "quota": "a quota of a queue needs the queue (`mailq queues` lists queues)",
    "release": "check the rule id (`mailq rules` lists the rules in force)",
}


#: UNAVAILABLE sent by a service that was reached: one of its backends (Cassandra, RabbitMQ, S3) is
#: down or alarmed, or it is stopping. Its message says which; nothing was done.
SERVED_UNAVAILABLE_HINT = ("the service was reached but could not do it now (the message says why: a backend down, a broker "
                           "alarm, a replica stopping) and did nothing: retry (the troubleshooting page has each case)")
#: What gRPC's own UNAVAILABLE says when no connection was made (refused, no such host, TLS refused).
_NOT_CONNECTED = ("failed to connect", "dns resolution failed", "connection refused", "handshake", "socket closed",
                  "connection reset", "name resolution")


def hint(code: grpc.StatusCode, command: str, details: str = "") -> str:
    """What to do about a failed call of ``command`` (``details``: the status's message)."""
    if code is grpc.StatusCode.NOT_FOUND and command in NOT_FOUND_HINTS:
        return NOT_FOUND_HINTS[command]
    if code is grpc.StatusCode.UNAVAILABLE and details and not any(s in details.lower() for s in _NOT_CONNECTED):
        return SERVED_UNAVAILABLE_HINT
    return HINTS.get(code, "")

#: The modules that hold the commands, each adding its own with ``register(sub)``, in this order:
#: queues (queues, show, size, create, retry-policy, shape, reconcile, drop, config), mails (browse, delete,
#: clear, flush, republish, move), transfer (enqueue, dequeue), rules (hold, bounce, rules, release),
#: throttle, quota, dead, trace (trace, events), webhook.
COMMANDS = (queues, mails, transfer, rules, throttle, quota, dead, trace)
COMMANDS += (webhook,)  # webhook add|list|remove (kept on its own line: one line to merge)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mailq", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", "--target", dest="host", default=os.environ.get("MAILQ_HOST", "localhost"),
                   help="cluster address: every service on its default port there (default: $MAILQ_HOST or localhost)")
    for name in DEFAULT_PORTS:
        p.add_argument(f"--{name}", metavar="HOST:PORT", help=f"{name}_svc target (default: $MAILQ_{name.upper()}, else --host:{DEFAULT_PORTS[name]})")
    p.add_argument("--token", help="bearer token (default: $MAILQ_TOKEN)")
    p.add_argument("--tls-ca", metavar="PEM", help="connect with TLS, trusting this CA (default: $MAILQ_TLS_CA; unset: plaintext)")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate for mutual TLS (default: $MAILQ_TLS_CERT)")
    p.add_argument("--tls-key", metavar="PEM", help="its key (default: $MAILQ_TLS_KEY)")
    p.add_argument("--timeout", type=real(maximum=1e6, above=True), metavar="S",
                   default=os.environ.get("MAILQ_TIMEOUT") or str(DEFAULT_TIMEOUT_S),  # a string: checked by its type
                   help=f"give up a call that gets no answer after S seconds (default: $MAILQ_TIMEOUT, else {DEFAULT_TIMEOUT_S:g}; "
                   "streams that show progress are not bounded)")
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (``EPILOG``). No traceback reaches the operator: a gRPC
    error is its status, details and a hint; a closed pipe and Ctrl-C end quietly."""
    try:
        try:
            return run(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a closed pipe is seen (and handled) now, --help's too
    except BrokenPipeError:
        return closed_pipe()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def run(argv: list[str] | None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(Client(a), a) or EXIT_OK
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as e:
        what = hint(e.code(), a.command, e.details() or "")
        print(f"mailq {a.command}: {e.code().name}: {e.details()}" + (f"\n  hint: {what}" if what else ""), file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        raise
    except OSError as e:
        print(f"mailq {a.command}: {e}", file=sys.stderr)
        return EXIT_ERROR


def closed_pipe() -> int:
    """The reader of stdout went away (``mailq browse Q | head``): what is still buffered goes to
    /dev/null, so the flush at exit raises nothing (the Python documentation's way for SIGPIPE;
    SIGPIPE's default action is not restored: it would also kill the process on a gRPC socket)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE
