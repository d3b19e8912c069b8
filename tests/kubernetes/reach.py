"""Run in a client pod before its command: wait until every gRPC target given answers a health
check, then exec the command. A new pod's address reaches the NetworkPolicy controller's ipsets a
moment after the pod starts (kube-router: 0.2-0.5 s measured here); until then its connections
are refused. ``reach.py TARGET... -- COMMAND...``; gives up after 60 s."""

import os
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

split = sys.argv.index("--")
targets, command = sys.argv[1:split], sys.argv[split + 1:]
deadline = time.monotonic() + 60
with open(os.environ["MAILQUEUE_TLS_CA"], "rb") as f:
    credentials = grpc.ssl_channel_credentials(f.read())
for target in targets:
    stub = health_pb2_grpc.HealthStub(grpc.secure_channel(target, credentials))
    while True:
        try:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            break
        except grpc.RpcError as e:
            if time.monotonic() > deadline:
                sys.exit(f"reach: {target} did not answer within 60 s: {e.code().name} {e.details()}")
            time.sleep(0.2)
os.execvp(command[0], command)
