"""mailq's commands that put a mail into a queue and take mails out, as a producer and a consumer do.

    mailq enqueue Q FILE.eml --from A --to B [--to C] [--name N] [--delay 10m] [--priority high|normal|low]
    mailq dequeue Q [-n N] [--ack success|retry|reject] [--retry-after 5m] [--out DIR] [--wait 10]
"""

from __future__ import annotations

import argparse
import os
import queue as q
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from mailq.common import DEFAULT_TIMEOUT_S, EXIT_NOTHING, EXIT_OK, Client, UsageError, delay_arg, duration, queue_command, real, whole
from mailqueue.v1 import blob_pb2, dequeue_pb2, enqueue_pb2, mail_pb2

CHUNK = 1024 * 1024


def cmd_enqueue(c: Client, a: argparse.Namespace) -> None:
    """The file is opened before the call: one that cannot be read (missing, a folder, no
    permission) is an OSError naming it, exit 1, and nothing is sent (opened inside the request
    stream, gRPC reported only "Exception iterating requests")."""
    # "<>" is the null sender as mailq prints it (the default, a bounce): the API's empty sender.
    mail = mail_pb2.Mail(name=a.name, sender="" if a.sender == "<>" else a.sender, recipients=a.to)
    header = enqueue_pb2.EnqueueHeader(queue=a.queue, mail=mail, priority=getattr(mail_pb2, f"PRIORITY_{a.priority.upper()}"))
    if a.delay is not None:
        header.delay.CopyFrom(duration(a.delay))

    with open(a.file, "rb") as f:
        def requests() -> Iterator[enqueue_pb2.EnqueueStreamRequest]:
            yield enqueue_pb2.EnqueueStreamRequest(header=header)
            while chunk := f.read(CHUNK):
                yield enqueue_pb2.EnqueueStreamRequest(chunk=chunk)

        r = c.enqueue.EnqueueStream(requests()).receipt
    print(f"{r.enqueue_id} queued ({r.size} bytes)")


#: Most deliveries a stream of ``mailq dequeue`` holds at once (its prefetch).
ROUND = 64
#: Seconds without a delivery after which the last mails held are answered (a server that is
#: stopping hands out nothing more, and waits for the answers to what it handed out).
IDLE_S = 1.0


def cmd_dequeue(c: Client, a: argparse.Namespace) -> int:
    """Take up to ``-n`` mails and answer each, handing out no more than that: each answer frees
    credit (the stream's prefetch), and a mail the server hands out for it after the last wanted
    one came is left unanswered (back in the queue with an attempt of the broker's delivery limit
    spent). So the stream's prefetch is at most what is still wanted, the mails are answered as
    they come while more are wanted than the credit could bring, and the last ones together with
    the half-close. When --wait passes first, the stream is half-closed (not cancelled): the
    server settles the answers sent and ends it; a delivery that arrives after that is left
    unanswered, so it goes back to the queue. No mail at all: EXIT_NOTHING."""
    if a.retry_after is not None and a.ack != "retry":  # it went out with a SUCCESS, read by nobody: the mail gone
        raise UsageError(f"mailq dequeue: --retry-after goes with --ack retry (with --ack {a.ack} the mail would not "
                         "be delivered again)")
    kind = {"success": dequeue_pb2.OUTCOME_KIND_SUCCESS, "retry": dequeue_pb2.OUTCOME_KIND_RETRY,
            "reject": dequeue_pb2.OUTCOME_KIND_REJECT}[a.ack]
    deadline = time.monotonic() + a.wait
    done = 0
    while done < a.n and time.monotonic() < deadline:  # a stream ended early (idle) is followed by another
        done += dequeue_stream(c, a, kind, a.n - done, deadline)
    if done == 0:
        print(f"mailq dequeue: no mail from {a.queue} within {a.wait:g} s (empty, or its mails are delayed, held or "
              "throttled: mailq show lists them)", file=sys.stderr)
        return EXIT_NOTHING
    more = "" if done >= a.n else f" (no more within {a.wait:g} s)"
    print(f"{done} mail(s) dequeued{more}", file=sys.stderr)
    return EXIT_OK


def dequeue_stream(c: Client, a: argparse.Namespace, kind: int, n: int, deadline: float) -> int:
    """One stream that takes up to ``n`` mails; the mails answered. It ends when they came, at the
    deadline, or IDLE_S after a delivery while it holds unanswered mails (they are answered then)."""
    prefetch = min(ROUND, n)
    requests: q.Queue = q.Queue()
    requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=a.queue, prefetch=prefetch)))
    # Half-closed at the deadline at the latest, the stream then ends once the server settled the
    # answers: bounded by --wait plus --timeout, like every call (a stuck dequeue_svc held it for ever).
    wait = max(deadline - time.monotonic(), 0.0)
    stream = c.dequeue.Dequeue(iter(requests.get, None), timeout=wait + getattr(a, "timeout", DEFAULT_TIMEOUT_S))
    answering = threading.Lock()  # a delivery is answered whole, or not at all, before the half-close
    closed = threading.Event()
    held: list[dequeue_pb2.Delivery] = []  # the last ``prefetch`` wanted: answered with the half-close
    counts = {"received": 0, "answered": 0}

    def answer_held_and_close() -> None:
        with answering:
            if closed.is_set():
                return
            closed.set()
            if held:
                requests.put(dequeue_pb2.DequeueRequest(outcomes=dequeue_pb2.Outcomes(outcomes=[outcome(a, d, kind) for d in held])))
                counts["answered"] += len(held)
            requests.put(None)  # half-close: the server settles the outcomes sent, then ends the stream

    timer = threading.Timer(wait, answer_held_and_close)
    timer.start()
    idle: threading.Timer | None = None
    try:
        for r in stream:
            if r.WhichOneof("kind") != "delivery":
                continue
            with answering:
                if closed.is_set():
                    continue  # left unanswered, back to the queue when the stream ends
                keep(c, a, r.delivery)
                counts["received"] += 1
                if counts["received"] <= n - prefetch:  # the credit it frees brings no more than wanted
                    requests.put(dequeue_pb2.DequeueRequest(outcome=outcome(a, r.delivery, kind)))
                    counts["answered"] += 1
                else:
                    held.append(r.delivery)
                    if idle is not None:
                        idle.cancel()
                    idle = threading.Timer(IDLE_S, answer_held_and_close)
                    idle.start()
                full = counts["received"] >= n
            if full:
                break
    except BaseException:  # Ctrl-C or a failed call: leave at once; a mail whose answer was not sent comes back
        timer.cancel()
        if idle is not None:
            idle.cancel()
        stream.cancel()
        raise
    timer.cancel()
    if idle is not None:
        idle.cancel()
    answer_held_and_close()
    for _ in stream:  # settled, then ended by the server
        pass
    return counts["answered"]


def keep(c: Client, a: argparse.Namespace, d: dequeue_pb2.Delivery) -> None:
    """Write the delivery's content (--out) before it is answered."""
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        content = d.content if d.content_inline else b"".join(
            p.chunk for b in d.mail.blob_ids for p in c.blob.Get(blob_pb2.GetRequest(blob_id=b)))
        with open(os.path.join(a.out, f"{d.mail.enqueue_id}.eml"), "wb") as f:
            f.write(content)


def outcome(a: argparse.Namespace, d: dequeue_pb2.Delivery, kind: int) -> dequeue_pb2.Outcome:
    """The answer to ``d``, printed as it is sent."""
    print(f"{d.mail.enqueue_id} {d.mail.mail.sender or '<>'} -> {','.join(d.mail.mail.recipients)} "
          f"[{a.ack}] attempt {d.mail.attempts + 1}")  # as mailq trace numbers it (ATTEMPT)
    o = dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=kind)
    if a.retry_after is not None:
        o.retry_after.CopyFrom(duration(a.retry_after))
    return o


def register(sub: Any) -> None:
    s = queue_command(sub, "enqueue", cmd_enqueue, "enqueue a mail from a file")
    s.add_argument("file")
    s.add_argument("--from", dest="sender", default="", help="envelope sender (default: <>)")
    s.add_argument("--to", action="append", required=True, help="recipient (repeat for several)")
    s.add_argument("--name", default="", help="the mail's name, for browse, delete and rules by name (default: none; "
                   "the printed enqueue id identifies the mail)")
    s.add_argument("--delay", type=delay_arg, help="deliver no earlier than this from now (e.g. 10m)")
    s.add_argument("--priority", choices=("high", "normal", "low"), default="normal")
    s = queue_command(sub, "dequeue", cmd_dequeue, "receive mails and answer them (success, retry or reject)")
    s.add_argument("-n", type=whole(1), default=1, help="how many mails (default 1)")
    s.add_argument("--ack", choices=("success", "retry", "reject"), default="success", help="the answer to each mail (default success)")
    s.add_argument("--retry-after", type=delay_arg, help="with --ack retry: deliver again after this")
    s.add_argument("--out", help="write each mail's content to DIR/<id>.eml")
    s.add_argument("--wait", type=real(maximum=86400, above=True), default=10,
                   help="give up after this many seconds (default 10); no mail by then: exit status 3")
