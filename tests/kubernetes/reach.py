"""Run in a client pod before its command: wait until every replica behind each gRPC target given
answers a health check, then exec the command. A new pod's address reaches the NetworkPolicy
controller's ipsets a moment after the pod starts (kube-router: 0.2-0.5 s measured here); until
then its connections are refused. Each replica is checked by its own address (the name's every
A record, the certificate checked against the name), since a client that balances over the
replicas (the Go client's round robin) reaches all of them, not the one a first connection picks.
``reach.py TARGET... -- COMMAND...``; gives up after 60 s."""

import os
import socket
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

split = sys.argv.index("--")
targets, command = sys.argv[1:split], sys.argv[split + 1:]
deadline = time.monotonic() + 60
with open(os.environ["MAILQUEUE_TLS_CA"], "rb") as f:
    credentials = grpc.ssl_channel_credentials(f.read())


def replicas(target: str) -> list[str]:
    """``dns:///host:port`` -> every ``ip:port`` the name resolves to now."""
    host, port = target.removeprefix("dns:///").rsplit(":", 1)
    try:
        return sorted({f"{a[4][0]}:{port}" for a in socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)})
    except socket.gaierror:
        return []


def answers(address: str, name: str) -> str | None:
    """None when the replica answers its health check, else why not."""
    with grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", name)]) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            return None
        except grpc.RpcError as e:
            return f"{e.code().name} {e.details()}"


for target in targets:
    name = target.removeprefix("dns:///").rsplit(":", 1)[0]
    while True:
        addresses = replicas(target)
        failing = {a: why for a in addresses if (why := answers(a, name)) is not None}
        if addresses and not failing:
            break
        if time.monotonic() > deadline:
            sys.exit(f"reach: {target} not answered by every replica within 60 s: "
                     f"resolved {addresses or 'to nothing'}; failing {failing}")
        time.sleep(0.2)
os.execvp(command[0], command)
