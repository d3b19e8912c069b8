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
from collections.abc import Iterator
from typing import Any

import grpc

from mailq.common import Client, duration, duration_arg, queue_command
from mailqueue.v1 import blob_pb2, dequeue_pb2, enqueue_pb2, mail_pb2

CHUNK = 1024 * 1024


def cmd_enqueue(c: Client, a: argparse.Namespace) -> None:
    mail = mail_pb2.Mail(name=a.name, sender=a.sender, recipients=a.to)

    def requests() -> Iterator[enqueue_pb2.EnqueueStreamRequest]:
        header = enqueue_pb2.EnqueueHeader(queue=a.queue, mail=mail,
                                           priority=getattr(mail_pb2, f"PRIORITY_{a.priority.upper()}"))
        if a.delay is not None:
            header.delay.CopyFrom(duration(a.delay))
        yield enqueue_pb2.EnqueueStreamRequest(header=header)
        with open(a.file, "rb") as f:
            while chunk := f.read(CHUNK):
                yield enqueue_pb2.EnqueueStreamRequest(chunk=chunk)

    r = c.enqueue.EnqueueStream(requests()).receipt
    print(f"{r.enqueue_id} queued ({r.size} bytes)")


def cmd_dequeue(c: Client, a: argparse.Namespace) -> None:
    kind = {"success": dequeue_pb2.OUTCOME_KIND_SUCCESS, "retry": dequeue_pb2.OUTCOME_KIND_RETRY,
            "reject": dequeue_pb2.OUTCOME_KIND_REJECT}[a.ack]
    requests: q.Queue = q.Queue()
    requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=a.queue, prefetch=min(a.n, 64))))
    stream = c.dequeue.Dequeue(iter(requests.get, None))
    timer = threading.Timer(a.wait, stream.cancel)
    timer.start()
    done = 0
    try:
        for r in stream:
            if r.WhichOneof("kind") != "delivery":
                continue
            d = r.delivery
            if a.out:
                os.makedirs(a.out, exist_ok=True)
                content = d.content if d.content_inline else b"".join(
                    p.chunk for b in d.mail.blob_ids for p in c.blob.Get(blob_pb2.GetRequest(blob_id=b)))
                with open(os.path.join(a.out, f"{d.mail.enqueue_id}.eml"), "wb") as f:
                    f.write(content)
            print(f"{d.mail.enqueue_id} {d.mail.mail.sender or '<>'} -> {','.join(d.mail.mail.recipients)} "
                  f"[{a.ack}] attempts {d.mail.attempts}")
            outcome = dequeue_pb2.Outcome(delivery_tag=d.delivery_tag, kind=kind)
            if a.retry_after is not None:
                outcome.retry_after.CopyFrom(duration(a.retry_after))
            requests.put(dequeue_pb2.DequeueRequest(outcome=outcome))
            done += 1
            if done >= a.n:
                break
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            raise
    finally:
        timer.cancel()
        requests.put(None)  # half-close: the server settles the outcomes sent, then ends the stream
        for _ in stream:
            pass
    print(f"{done} mail(s) dequeued", file=sys.stderr)


def register(sub: Any) -> None:
    s = queue_command(sub, "enqueue", cmd_enqueue, "enqueue a mail from a file")
    s.add_argument("file")
    s.add_argument("--from", dest="sender", default="", help="envelope sender (default: <>)")
    s.add_argument("--to", action="append", required=True, help="recipient (repeat for several)")
    s.add_argument("--name", default="", help="the mail's name, for browse, delete and rules by name (default: none; "
                   "the printed enqueue id identifies the mail)")
    s.add_argument("--delay", type=duration_arg, help="deliver no earlier than this from now (e.g. 10m)")
    s.add_argument("--priority", choices=("high", "normal", "low"), default="normal")
    s = queue_command(sub, "dequeue", cmd_dequeue, "receive mails and answer them (success, retry or reject)")
    s.add_argument("-n", type=int, default=1, help="how many mails (default 1)")
    s.add_argument("--ack", choices=("success", "retry", "reject"), default="success")
    s.add_argument("--retry-after", type=duration_arg, help="with --ack retry: deliver again after this")
    s.add_argument("--out", help="write each mail's content to DIR/<id>.eml")
    s.add_argument("--wait", type=float, default=10, help="give up after this many seconds (default 10)")
