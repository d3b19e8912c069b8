"""Several worker processes behind one port (``MAILQUEUE_WORKERS``): a pod that uses more than one core.

A Python process runs its event loop, and most of its gRPC and protobuf work, on one core at a
time. With ``MAILQUEUE_WORKERS=N`` (N > 1) a service's command starts a supervisor instead, which
starts N copies of the service (``python -m <package>``). Each copy is an ordinary service
process: it binds the same ports with SO_REUSEPORT (gRPC's default on Linux) and the kernel
spreads new connections over the copies. Nothing is shared between them but the backends, as
between replicas: each has its own claims, limiter share and background rounds.

- **Metrics:** the supervisor serves ``/metrics`` on ``MAILQUEUE_METRICS_PORT`` for all of them
  (prometheus_client's multiprocess mode, files in a private folder): counters and histograms
  are summed over the workers, alive or not; a gauge has a series per live worker, labelled
  ``pid``.
- **Crash-only:** a worker that ends without being asked is started again (start-up is
  recovery), after a pause that doubles, from 1 s to 30 s, while it keeps ending within 10 s of
  its start. One that refuses to start (exit 2: its configuration) stops them all, with exit 2.
- **Not for webhook_svc:** its deliverer must be one process (k8s/base/webhook.yaml); more than
  one worker is refused there (services/runtime/settings.py).
- **Stopping:** SIGTERM or SIGINT is passed to every worker (each drains as a single process
  does: lameduck, then grace); the supervisor exits once they have all ended. A second signal is
  passed on too (it cuts the lameduck short).
- **A worker never outlives its supervisor,** even one killed with SIGKILL: the kernel sends the
  worker SIGTERM when its parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from prometheus_client import CollectorRegistry, multiprocess, start_http_server

from services.runtime.server_settings import ServerSettings

log = logging.getLogger(__name__)

#: Set by the supervisor in each worker's environment: its index (1..N) and the supervisor's pid.
WORKER_VARIABLE = "MAILQUEUE_WORKER"
SUPERVISOR_VARIABLE = "MAILQUEUE_SUPERVISOR_PID"
#: Exit status of a service that refuses to start (services/runtime/server.py main).
REFUSED = 2
FIRST_PAUSE_S, LAST_PAUSE_S, STEADY_S = 1.0, 30.0, 10.0
POLL_S = 0.1
_PR_SET_PDEATHSIG = 1


def attach(settings: ServerSettings) -> None:
    """In a worker: end with the supervisor (SIGTERM when it dies); exit at once if it already has."""
    if not settings.worker:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("cannot ask to end with the supervisor (prctl: errno %d)", ctypes.get_errno())
    supervisor = os.environ.get(SUPERVISOR_VARIABLE)
    if supervisor and os.getppid() != int(supervisor):
        sys.exit(0)  # the supervisor died before prctl took effect


def next_pause(last: float | None, ran_s: float) -> float:
    """Seconds before starting again a worker that ended after ``ran_s`` seconds, the pause
    before its last start being ``last`` (None: none yet): doubled while it keeps ending within
    STEADY_S, from FIRST_PAUSE_S to LAST_PAUSE_S; FIRST_PAUSE_S again after a steady run."""
    if last is None or ran_s >= STEADY_S:
        return FIRST_PAUSE_S
    return min(last * 2, LAST_PAUSE_S)


class _Collector(multiprocess.MultiProcessCollector):
    """The workers' metrics files; a scrape that meets those of a worker that just ended reads again."""

    def collect(self):  # noqa: ANN202 - prometheus_client's signature
        for _ in range(3):
            try:
                return list(super().collect())
            except FileNotFoundError:
                continue
        return []


class Supervisor:
    """Starts, restarts and stops the workers of one service; serves their metrics."""

    def __init__(self, package: str, settings: ServerSettings) -> None:
        self.package = package
        self.settings = settings
        self.folder = tempfile.mkdtemp(prefix=f"mailqueue-{settings.service}-metrics-")
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self.pauses: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.due: dict[int, float] = {}  # index -> when to start it again
        self.stopping = False
        self.refused = False

    def environment(self, index: int) -> dict[str, str]:
        return {**os.environ, WORKER_VARIABLE: str(index), SUPERVISOR_VARIABLE: str(os.getpid()),
                "PROMETHEUS_MULTIPROC_DIR": self.folder, "MAILQUEUE_METRICS_PORT": "0"}

    def start(self, index: int) -> None:
        proc = subprocess.Popen([sys.executable, "-m", self.package], env=self.environment(index))
        self.workers[index] = proc
        self.started_at[index] = time.monotonic()
        log.info("worker started", extra={"worker": index, "pid": proc.pid})
        if self.stopping:  # a signal handled while it started did not reach it
            proc.send_signal(signal.SIGTERM)

    def signal_all(self, signum: int) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    def stop_all(self) -> None:
        """No more starts; SIGTERM to every worker (again, if told again)."""
        self.stopping = True
        self.due.clear()
        self.signal_all(signal.SIGTERM)

    def on_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("stopping the workers", extra={"signal": signal.Signals(signum).name, "workers": len(self.workers)})
        self.stop_all()

    def serve_metrics(self) -> None:
        if not self.settings.metrics_port:
            return
        registry = CollectorRegistry()
        _Collector(registry, path=self.folder)
        try:
            start_http_server(self.settings.metrics_port, addr=self.settings.host, registry=registry)
        except OSError as e:  # as one process refuses (services/runtime/server.py): one line, exit 2
            log.critical("refusing to start: MAILQUEUE_METRICS_PORT=%s: cannot listen on %s:%s (%s): another process has "
                         "it (a second copy of this service?); stop it or set another port", self.settings.metrics_port,
                         self.settings.host, self.settings.metrics_port, e.strerror)
            raise SystemExit(REFUSED) from None

    def ended(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        """A worker ended: forget its gauges; start it again unless stopping or refused."""
        del self.workers[index]
        for path in glob.glob(os.path.join(self.folder, f"gauge_*_{proc.pid}.db")):
            os.remove(path)  # a dead worker's gauges are no longer true; its counters stay in the sums
        code = proc.returncode
        if self.stopping:
            log.info("worker stopped", extra={"worker": index, "pid": proc.pid, "exit": code})
            return
        if code == REFUSED:
            log.critical("a worker refused to start: stopping them all", extra={"worker": index, "pid": proc.pid})
            self.refused = True
            self.stop_all()
            return
        pause = self.pauses[index] = next_pause(self.pauses.get(index), time.monotonic() - self.started_at[index])
        self.due[index] = time.monotonic() + pause
        log.warning("worker ended: starting it again", extra={"worker": index, "pid": proc.pid, "exit": code, "pause_s": pause})

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        try:
            self.serve_metrics()
            log.info("supervising", extra={"workers": self.settings.workers, "port": self.settings.port,
                                           "metrics_port": self.settings.metrics_port or "off"})
            for index in range(1, self.settings.workers + 1):
                self.start(index)
            while self.workers or (self.due and not self.stopping):
                for index, proc in list(self.workers.items()):
                    if proc.poll() is not None:
                        self.ended(index, proc)
                now = time.monotonic()
                for index, at in list(self.due.items()):
                    if at <= now and not self.stopping:
                        del self.due[index]
                        self.start(index)
                time.sleep(POLL_S)
        finally:
            self.signal_all(signal.SIGTERM)
            shutil.rmtree(self.folder, ignore_errors=True)
        log.info("stopped", extra={"refused": self.refused})
        return REFUSED if self.refused else 0
