"""Start, stop or show the services (the four, and webhook_svc) as local background processes (logs under .stack/logs).

    python -m stack.services start | stop | status       (what stack/services.sh runs)

They serve gRPC over TLS (the local CA's certificate, stack/pki.sh) and reach the backends over
TLS, each with its own credential (stack/stack.sh env NAME). A client trusts .stack/pki/ca.crt.
Exit codes: 0; 1 when a service is not SERVING after 60 s (its log named); 2 on a wrong command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from stack import harness

#: (name, gRPC port); each serves its metrics on port + 1000.
SERVICES = [("blob", 50054), ("enqueue", 50051), ("dequeue", 50052), ("browse", 50053), ("webhook", 50055)]


def stack_dir() -> str:
    return harness.stack_dir()


def pid_file(name: str) -> str:
    return os.path.join(stack_dir(), f"svc-{name}.pid")


def log_file(name: str) -> str:
    return os.path.join(stack_dir(), "logs", f"{name}.log")


def ca_file() -> str:
    return os.path.join(stack_dir(), "pki", "ca.crt")


def python() -> str:
    return os.environ.get("MAILQUEUE_PYTHON", os.path.join(harness.ROOT, ".venv", "bin", "python"))


def pid_of(name: str) -> int | None:
    """The pid in .stack/svc-NAME.pid when that process is NAME_svc and alive."""
    try:
        with open(pid_file(name)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if harness.alive(pid, name) else None


def serving(port: int) -> bool:
    """gRPC health says SERVING, over TLS trusting the local CA."""
    credentials = harness.tls_credentials(ca_file())
    return credentials is not None and harness.is_serving(f"127.0.0.1:{port}", credentials)


def service_env(name: str) -> dict[str, str]:
    """This process's environment, the service's own backend variables (stack/stack.sh env NAME)
    and the certificate it serves TLS with."""
    pki = os.path.join(stack_dir(), "pki")
    env = dict(os.environ)
    for line in harness.stack("env", name).stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    env["MAILQUEUE_TLS_CERT_FILE"] = os.path.join(pki, "services.crt")
    env["MAILQUEUE_TLS_KEY_FILE"] = os.path.join(pki, "services.key")
    return env


def start() -> int:
    for name, port in SERVICES:
        if pid_of(name) is not None:
            continue
        try:
            env = service_env(name)
        except subprocess.CalledProcessError as e:
            print(f"[services] stack/stack.sh env {name} failed: {e.stderr.strip()}", file=sys.stderr)
            return 1
        service = harness.Service(name, env, port, log=log_file(name), python=python(),
                                  credentials=harness.tls_credentials(ca_file()), detach=True)
        service.start(wait=False)
        with open(pid_file(name), "w") as f:
            f.write(f"{service.pid}\n")
    deadline = time.monotonic() + 60
    for name, port in SERVICES:
        while not serving(port):
            if time.monotonic() > deadline:
                print(f"[services] {name} is not SERVING after 60 s: read {log_file(name)}", file=sys.stderr)
                status()
                return 1
            time.sleep(0.5)
    status()
    return 0


def stop() -> int:
    for name, _port in SERVICES:
        pid = pid_of(name)
        if pid is None:
            continue
        harness.stop_pid(pid, name)
        try:
            os.remove(pid_file(name))
        except FileNotFoundError:
            pass
    return 0


def status() -> int:
    row = "{:<10} {:<18} {:<8} {:<10} {}"
    print(row.format("SERVICE", "GRPC", "PID", "METRICS", "HEALTH"))
    for name, port in SERVICES:
        pid = pid_of(name)
        health = "SERVING" if serving(port) else "DOWN"
        print(row.format(name, f"127.0.0.1:{port}", "-" if pid is None else pid, f":{port + 1000}", health), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    commands = {"start": start, "stop": stop, "status": status}
    if not args or args[0] not in commands:  # as stack/services.sh: further arguments are ignored
        print(f"usage: {os.environ.get('MAILQUEUE_SERVICES_USAGE', 'python -m stack.services')} start|stop|status",
              file=sys.stderr)
        return 2
    return commands[args[0]]()


if __name__ == "__main__":
    sys.exit(main())
