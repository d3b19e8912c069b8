"""ghz (a gRPC load client in Go) as a bench phase: unary Enqueue over TLS, beside the Python client.

The Python client costs about a quarter of a core at a thousand calls a second, on the cores the
server and the backends share; ghz costs a fraction of that, so it measures the server rather than
its client. Built once per machine by ``make ghz`` (go install github.com/bojand/ghz/cmd/ghz@v0.93.0,
into ~/.cache/mailqueue-stack/ghz-v0.93.0); MAILQUEUE_GHZ names another binary.

Every call carries distinct content (no deduplication shortcut): the request is a ghz template whose
``inline_content`` is base64 with 32 random letters and digits of ghz's ``randomString`` in the
middle (characters of the base64 alphabet: they decode to 24 random bytes), the rest padding to
``size`` bytes. (ghz decodes bytes fields as standard base64 only: its per-call UUID, with its
dashes, is not.)
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import time
from typing import Any

from bench.common import PORTS, CpuMeter
from stack.harness import ROOT

VERSION = "v0.93.0"
BINARY = os.path.join(os.environ.get("MAILQUEUE_CACHE_DIR") or os.path.expanduser("~/.cache/mailqueue-stack"),
                      f"ghz-{VERSION}", "ghz")
CALL = "mailqueue.v1.EnqueueService.Enqueue"
#: ghz's deadline per call (its default, 20 s): a call the service never answers ends as DeadlineExceeded.
CALL_TIMEOUT_S = 20


def wait_for(proc: subprocess.Popen, within_s: float) -> tuple[int, Any]:
    """(wait status, rusage) of ``proc`` once it ends; killed past ``within_s`` (a ghz that hangs)."""
    deadline = time.monotonic() + within_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return status, usage
        time.sleep(0.2)


def binary() -> str:
    """The ghz to run; stops the bench with what to do when there is none."""
    path = os.environ.get("MAILQUEUE_GHZ") or BINARY
    if not os.access(path, os.X_OK):
        raise SystemExit(f"no ghz at {path}: build it with `make ghz` (or set MAILQUEUE_GHZ)")
    return path


def request_template(queue: str, size: int) -> dict[str, Any]:
    """An EnqueueRequest in protobuf JSON whose content is ``size`` bytes, distinct per call."""
    head = b"Subject: bench ghz\r\n\r\n"
    head += b"x" * (-len(head) % 3)  # whole base64 groups: the random characters start a group
    tail = b"\r\n" + b"x" * max(size - len(head) - 24 - 2, 0)
    content = base64.b64encode(head).decode() + "{{randomString 32}}" + base64.b64encode(tail).decode()
    return {"queue": queue, "mail": {"name": "bench", "sender": "a@example.com", "recipients": ["b@example.org"]},
            "inlineContent": content}


def health_protoset(folder: str) -> str:
    """grpc.health.v1's descriptor as a protoset file for ghz (the Python server's reflection does
    not resolve a method's symbol, which ghz asks for)."""
    from google.protobuf import descriptor_pb2
    from grpc_health.v1 import health_pb2

    path = os.path.join(folder, "health.protoset")
    with open(path, "wb") as f:
        f.write(descriptor_pb2.FileDescriptorSet(
            file=[descriptor_pb2.FileDescriptorProto.FromString(health_pb2.DESCRIPTOR.serialized_pb)]).SerializeToString())
    return path


def run_ghz(queue: str, seconds: float, concurrency: int, connections: int, size: int, ca_file: str,
            services: dict[str, int] | None = None, statements: Any = None, call: str = CALL) -> dict[str, Any]:
    """One ghz run of ``seconds`` against the bench's enqueue_svc over TLS: the common.load result
    (ops, per_s, p50_ms, p99_ms, cpu, stmts) with ``errors``; with ``services``, CPU per mail of
    each process, ghz's own from its rusage. ``call``: another method than Enqueue, found by
    its protoset and called with an empty request: grpc.health.v1.Health/Check, the gRPC floor."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out = os.path.join(tmp, "request.json"), os.path.join(tmp, "report.json")
        with open(data, "w") as f:
            json.dump(request_template(queue, size) if call == CALL else {}, f)
        if call == CALL:
            described = ["--proto", os.path.join(ROOT, "protos", "mailqueue", "v1", "enqueue.proto"),
                         "--import-paths", os.path.join(ROOT, "protos")]
        else:
            described = ["--protoset", health_protoset(tmp)]
        command = [binary(), *described, "--call", call, "--cacert", ca_file,
                   "-c", str(concurrency), "--connections", str(connections), "-z", f"{seconds:g}s",
                   "-t", f"{CALL_TIMEOUT_S}s",
                   "-D", data, "-O", "json", "-o", out, f"127.0.0.1:{PORTS['enqueue']}"]
        began = time.monotonic()
        with open(os.path.join(tmp, "stderr"), "w+") as err:  # a file: a full pipe would stop ghz
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
            meter = CpuMeter(services or {}, statements)
            status, usage = wait_for(proc, seconds + CALL_TIMEOUT_S + 30)
            proc.returncode = os.waitstatus_to_exitcode(status)
            elapsed = time.monotonic() - began
            if proc.returncode != 0 or not os.path.exists(out):
                err.seek(0)
                raise SystemExit(f"ghz ended with {proc.returncode} after {elapsed:.0f} s: {err.read()[-2000:]}")
        with open(out) as f:
            r = json.load(f)
    # The calls in flight when -z ends are closed by ghz: up to -c of them come back Unavailable.
    codes = r.get("statusCodeDistribution") or {}
    ok = int(codes.get("OK", 0))
    latency = {int(p["percentage"]): p["latency"] / 1e6 for p in r.get("latencyDistribution") or []}
    return {
        "ops": ok, "per_s": ok / (r["total"] / 1e9), "p50_ms": latency.get(50, 0.0), "p99_ms": latency.get(99, 0.0),
        "errors": {code: n for code, n in codes.items() if code != "OK"}, "elapsed": elapsed,
        "cpu": meter.per_op(max(ok, 1), {"ghz": usage.ru_utime + usage.ru_stime}),
        "stmts": meter.statements_per_op(ok),
    }


def phase(queue: str, seconds: float, concurrency: int, size: int, warmup: float, services: dict[str, int],
          ca_file: str, connections: int = 4, statements: Any = None) -> dict[str, Any]:
    """``warmup`` seconds of ghz unmeasured, then ``seconds`` measured (ghz has no warm-up of its own)."""
    if warmup > 0:
        run_ghz(queue, warmup, concurrency, connections, size, ca_file)
    return run_ghz(queue, seconds, concurrency, connections, size, ca_file, services, statements)
