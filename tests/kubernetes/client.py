"""Producers and consumers inside the cluster (the Kubernetes tier runs this file in a pod of the
mailqueue image, from a ConfigMap): they reach enqueue_svc and dequeue_svc by their Service DNS
names, balanced over every replica (round_robin over the headless Service's addresses).

Producers send unary Enqueues with unique names, each name its idempotency key, and retry a
refused one with the same key until it is OK (a client that never gives up on a mail). Consumers
take up to ``--batch`` deliveries on a Dequeue stream, answer SUCCESS, then half-close: the server
ends a half-closed stream with OK only after every outcome sent on it was settled, so an OK end
confirms those SUCCESSes. Producing stops when ``/tmp/stop`` exists (``kubectl exec ... touch``)
or after ``--seconds``; consumers then drain until every acknowledged mail was delivered, or
``--drain`` seconds pass. The last line printed is the JSON record the tier reads from the log.

Standalone on purpose: the image carries the generated stubs, not the tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue as q
import threading
import time
import uuid

import grpc

from mailqueue.v1 import dequeue_pb2, dequeue_pb2_grpc, enqueue_pb2, enqueue_pb2_grpc, mail_pb2


# Client-side health checking (healthCheckConfig) on the API's own health name: a terminating
# server keeps it SERVING through its lameduck (while DNS may still name only it), then turns it
# NOT_SERVING a moment before its connections close, and the channel leaves it then. Without it,
# a call that arrives at the instant a server stops ends CANCELLED (grpc core, grpc/grpc#41785).
def service_config(service: str) -> str:
    return json.dumps({"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": service}})


CONTENT = b"Subject: kubernetes\r\n\r\n" + b"x" * 1024
STOP_FILE = "/tmp/stop"


class Record:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, str] = {}  # name -> enqueue id
        self.delivered: dict[str, list[float]] = collections.defaultdict(list)  # enqueue id -> times
        self.confirmed: dict[str, float] = {}  # enqueue id -> time its SUCCESS was confirmed
        self.acked_at: dict[str, float] = {}
        self.latencies: list[float] = []  # seconds per OK Enqueue
        self.codes: collections.Counter = collections.Counter()  # "enqueue OK", "dequeue UNAVAILABLE", ...
        self.details: dict[str, str] = {}  # the first detail of each code other than OK
        self.ok_enqueues: list[float] = []
        self.deliveries: list[float] = []

    def code(self, kind: str, code: grpc.StatusCode, detail: str = "") -> None:
        with self.lock:
            self.codes[f"{kind} {code.name}"] += 1
            if code != grpc.StatusCode.OK:
                self.details.setdefault(f"{kind} {code.name}", detail[:300])


def channel(target: str, service: str) -> grpc.Channel:
    # round_robin over the headless Service's addresses; re-resolved at most once a second (the
    # default, 30 s, leaves a client that lost every known replica in a rolling update waiting).
    # Over TLS, trusting the CA of the services' certificate (the pod's MAILQUEUE_TLS_CA).
    with open(os.environ["MAILQUEUE_TLS_CA"], "rb") as f:
        credentials = grpc.ssl_channel_credentials(f.read())
    return grpc.secure_channel(target, credentials, options=[("grpc.service_config", service_config(service)), ("grpc.enable_retries", 0),
                                                             ("grpc.dns_min_time_between_resolutions_ms", 1000)])


def produce(stub, queue: str, token: str, record: Record, stopping: threading.Event, pause: float) -> None:
    metadata = (("authorization", f"Bearer {token}"),)
    while not stopping.is_set():
        name = uuid.uuid4().hex
        request = enqueue_pb2.EnqueueRequest(queue=queue, inline_content=CONTENT, idempotency_key=name,
                                             mail=mail_pb2.Mail(name=name, sender="k@example.com", recipients=["r@example.org"]))
        while True:  # the same key until OK: the mail is the client's to keep
            sent = time.time()
            try:
                receipt = stub.Enqueue(request, timeout=30, metadata=metadata).receipt
            except grpc.RpcError as e:
                record.code("enqueue", e.code(), e.details() or "")
                time.sleep(0.05)
                continue
            record.code("enqueue", grpc.StatusCode.OK)
            with record.lock:
                record.acked[name] = receipt.enqueue_id
                record.acked_at[receipt.enqueue_id] = time.time()
                record.ok_enqueues.append(time.time())
                record.latencies.append(time.time() - sent)
            break
        if pause:
            time.sleep(pause)


def consume(stub, queue: str, token: str, record: Record, done: threading.Event, batch: int) -> None:
    metadata = (("authorization", f"Bearer {token}"),)
    while not done.is_set():
        requests: q.Queue = q.Queue()
        requests.put(dequeue_pb2.DequeueRequest(subscribe=dequeue_pb2.Subscribe(queue=queue, prefetch=batch)))
        call = stub.Dequeue(iter(requests.get, None), timeout=60, metadata=metadata)
        answered: list[str] = []  # answered on this stream before its half-close: the OK end confirms them
        state = {"closed": False}
        lock = threading.Lock()

        def half_close() -> None:
            with lock:
                if not state["closed"]:
                    state["closed"] = True
                    requests.put(None)

        quiet = threading.Timer(2.0, half_close)  # a quiet queue: end the stream anyway
        quiet.start()
        try:
            for response in call:
                if not response.HasField("delivery"):
                    continue
                d, now = response.delivery, time.time()
                with record.lock:
                    record.delivered[d.mail.enqueue_id].append(now)
                    record.deliveries.append(now)
                with lock:
                    if state["closed"]:
                        continue  # after the half-close: unanswered, the server returns it to the queue
                    requests.put(dequeue_pb2.DequeueRequest(outcome=dequeue_pb2.Outcome(
                        delivery_tag=d.delivery_tag, kind=dequeue_pb2.OUTCOME_KIND_SUCCESS)))
                    answered.append(d.mail.enqueue_id)
                if len(answered) == batch:
                    quiet.cancel()
                    half_close()
            record.code("dequeue", grpc.StatusCode.OK)
            now = time.time()
            with record.lock:
                for eid in answered:
                    record.confirmed.setdefault(eid, now)
        except grpc.RpcError as e:
            record.code("dequeue", e.code(), e.details() or "")
            time.sleep(0.05)
        finally:
            quiet.cancel()


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest interval without an event between start and end: (its length, when it began)."""
    marks = [start, *sorted(t for t in times if start <= t <= end), end]
    return max((b - a, a) for a, b in zip(marks, marks[1:]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--queue", required=True)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--rate", type=float, default=0.0, help="pause between one producer's mails (s)")
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--drain", type=float, default=120)
    a = p.parse_args()
    enqueue = enqueue_pb2_grpc.EnqueueServiceStub(channel(os.environ["MAILQUEUE_ENQUEUE_TARGET"], "mailqueue.v1.EnqueueService"))
    dequeue = dequeue_pb2_grpc.DequeueServiceStub(channel(os.environ["MAILQUEUE_DEQUEUE_TARGET"], "mailqueue.v1.DequeueService"))
    record, stopping, done = Record(), threading.Event(), threading.Event()
    started = time.time()
    producers = [threading.Thread(target=produce, args=(enqueue, a.queue, os.environ["PRODUCER_TOKEN"], record, stopping, a.rate))
                 for _ in range(a.producers)]
    consumers = [threading.Thread(target=consume, args=(dequeue, a.queue, os.environ["CONSUMER_TOKEN"], record, done, a.batch))
                 for _ in range(a.consumers)]
    for t in producers + consumers:
        t.start()
    print(f"client: {a.producers} producers, {a.consumers} consumers on {a.queue}", flush=True)
    while not os.path.exists(STOP_FILE) and time.time() - started < a.seconds:
        time.sleep(0.2)
        if int(time.time() - started) % 10 == 0:
            print(f"client: {len(record.acked)} acked, {len(record.delivered)} delivered", flush=True)
            time.sleep(0.8)
    stopping.set()
    for t in producers:
        t.join()
    stopped = time.time()
    deadline = stopped + a.drain
    while time.time() < deadline:
        with record.lock:
            if all(eid in record.delivered for eid in record.acked.values()):
                break
        time.sleep(0.2)
    done.set()
    for t in consumers:
        t.join(90)
    alive = sum(t.is_alive() for t in consumers)
    late = [eid for eid, at in record.confirmed.items() if any(t > at + 0.001 for t in record.delivered[eid])]
    print(json.dumps({
        "acked": len(record.acked),
        "lost": sorted(eid for eid in record.acked.values() if eid not in record.delivered),
        "lost_acked_at": sorted(record.acked_at[eid] for eid in record.acked.values() if eid not in record.delivered),
        "delivered_after_confirmed_success": late,
        "delivered_twice": sum(len(v) > 1 for v in record.delivered.values()),
        "consumers_still_running": alive,
        "codes": dict(record.codes), "details": record.details,
        "longest_enqueue_gap_s": round(longest_gap(record.ok_enqueues, started + 5, stopped)[0], 3),
        "longest_enqueue_gap_at": longest_gap(record.ok_enqueues, started + 5, stopped)[1],
        "longest_delivery_gap_s": round(longest_gap(record.deliveries, started + 5, stopped)[0], 3),
        "longest_delivery_gap_at": longest_gap(record.deliveries, started + 5, stopped)[1],
        "slowest_enqueue_s": round(max(record.latencies, default=0), 3),
        "started": started, "stopped": stopped,
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
