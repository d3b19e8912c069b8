"""gRPC over TLS (#38, its first part): a service serves TLS from certificate files, reloads them
when they change without harming open streams, and with mutual TLS takes the role from the client
certificate's identity (a URI SAN or the CN), beside bearer tokens. mailq connects with TLS."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys

import grpc
import pytest

from mailqueue.v1 import admin_pb2, admin_pb2_grpc, browse_pb2, browse_pb2_grpc, dequeue_pb2_grpc, enqueue_pb2_grpc
from stack.harness import ROOT, ServiceProcess, service_env, wait_until
from tests.integration.helpers import StreamConsumer, code_of, inline, simple_mail
from tests.pki import PKI, der, served_certificate

ADMIN_TOKEN = "tls-test-admin-token-0001"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    p = PKI(tmp_path_factory.mktemp("pki"))
    p.issue("server", "mailqueue-browse", "IP:127.0.0.1,DNS:localhost")
    p.issue("reporting", "reporting-client", "URI:spiffe://mailqueue/reporting")
    p.issue("ops", "ops", "DNS:ops.example.org")
    p.issue("stranger", "stranger", "URI:spiffe://mailqueue/nobody")
    p.issue("posing", "ops", "URI:spiffe://mailqueue/nobody")  # a mapped CN beside an unmapped URI SAN
    p._ca("other-ca")
    p.issue("foreign", "ops", "URI:spiffe://mailqueue/reporting", ca="other-ca")
    p.issue("foreign-server", "mailqueue-browse", "IP:127.0.0.1,DNS:localhost", ca="other-ca")
    p.issue_expired("expired", "ops", "URI:spiffe://mailqueue/reporting")
    p.issue_expired("expired-server", "mailqueue-browse", "IP:127.0.0.1,DNS:localhost")
    return p


def tls_env(keyspace: str, pki: PKI, mutual: bool = False, **extra: str) -> dict[str, str]:
    env = {"MAILQUEUE_TLS_CERT_FILE": os.path.join(pki.path, "server.crt"),
           "MAILQUEUE_TLS_KEY_FILE": os.path.join(pki.path, "server.key")}
    if mutual:
        env.update({"MAILQUEUE_TLS_CLIENT_CA_FILE": pki.ca,
                    "MAILQUEUE_TLS_IDENTITIES": "spiffe://mailqueue/reporting=reader,ops=admin",
                    "MAILQUEUE_TOKENS": f"admin:{ADMIN_TOKEN}"})
    return service_env(keyspace, **{**env, **extra})


def test_a_service_serves_tls_and_mailq_connects_with_it(keyspace, running_stack, pki, tmp_path):
    browse = ServiceProcess("browse", tls_env(keyspace, pki), credentials=pki.credentials())
    try:
        plain = browse_pb2_grpc.BrowseServiceStub(grpc.insecure_channel(browse.target))
        assert code_of(lambda: plain.ListQueues(browse_pb2.ListQueuesRequest(), timeout=5)) == grpc.StatusCode.UNAVAILABLE
        secure = browse_pb2_grpc.BrowseServiceStub(browse.channel())
        assert code_of(lambda: secure.ListQueues(browse_pb2.ListQueuesRequest(), timeout=10)) == grpc.StatusCode.OK
        # The installed entry point, from another directory, as an operator runs it.
        mailq = shutil.which("mailq", path=os.path.dirname(sys.executable))
        r = subprocess.run([mailq, "--browse", browse.target, "--tls-ca", pki.ca, "create", "tls-made"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([mailq, "--browse", browse.target, "queues"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "UNAVAILABLE" in r.stderr  # plaintext to a TLS server
    finally:
        browse.stop()


def test_mutual_tls_gives_the_role_of_the_client_certificate_beside_tokens(keyspace, running_stack, pki):
    browse = ServiceProcess("browse", tls_env(keyspace, pki, mutual=True), credentials=pki.credentials("ops"))
    try:
        def calls(client: str | None, token: str = ""):
            channel = grpc.secure_channel(browse.target, pki.credentials(client))
            md = (("authorization", f"Bearer {token}"),) if token else None
            read = lambda: browse_pb2_grpc.BrowseServiceStub(channel).ListQueues(browse_pb2.ListQueuesRequest(), timeout=10, metadata=md)  # noqa: E731
            write = lambda: admin_pb2_grpc.AdminServiceStub(channel).CreateQueue(  # noqa: E731
                admin_pb2.CreateQueueRequest(queue=f"mtls-{client}"), timeout=10, metadata=md)
            return code_of(read), code_of(write)

        P, OK, NA = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
        assert calls(None) == (NA, NA)  # no client certificate: no handshake
        assert calls("foreign") == (NA, NA)  # a certificate from another CA
        assert calls("expired") == (NA, NA)  # from the CA, expired (2020), with an identity that has a role
        assert calls("stranger") == (P, P)  # from the CA, authenticated, but no role for its identity
        assert calls("posing") == (P, P)  # its URI SAN is its identity: the CN "ops" beside it gives no role
        assert calls("reporting") == (OK, P)  # URI SAN spiffe://mailqueue/reporting: reader
        assert calls("ops") == (OK, OK)  # CN ops: admin
        assert calls("stranger", ADMIN_TOKEN) == (OK, OK)  # a token decides when presented
        U = grpc.StatusCode.UNAUTHENTICATED
        assert calls("ops", "revoked-or-mistyped-token") == (U, U)  # an unknown token is refused, never the certificate's role
    finally:
        browse.stop()


def test_clients_refuse_a_server_certificate_from_another_ca_or_expired(keyspace, running_stack, pki):
    for name in ("foreign-server", "expired-server"):
        env = tls_env(keyspace, pki, MAILQUEUE_TLS_CERT_FILE=os.path.join(pki.path, f"{name}.crt"),
                      MAILQUEUE_TLS_KEY_FILE=os.path.join(pki.path, f"{name}.key"))
        browse = ServiceProcess("browse", env, wait=False)
        try:
            wait_until(lambda: _handshake_unverified(browse.port), 60, interval=0.2, what="the server's TLS port")
            # A client that trusts our CA: the handshake fails, no call is made.
            stub = browse_pb2_grpc.BrowseServiceStub(grpc.secure_channel(browse.target, pki.credentials()))
            assert code_of(lambda: stub.ListQueues(browse_pb2.ListQueuesRequest(), timeout=5)) == grpc.StatusCode.UNAVAILABLE, name
            with pytest.raises(ssl.SSLCertVerificationError):
                served_certificate(browse.port, pki.ca)
        finally:
            browse.stop()


def _handshake_unverified(port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock, context.wrap_socket(sock):
            return True
    except OSError:
        return False


def test_renewed_certificate_files_are_served_without_a_restart_and_open_streams_go_on(keyspace, running_stack, pki):
    env = tls_env(keyspace, pki)
    enqueue = ServiceProcess("enqueue", env, credentials=pki.credentials())
    dequeue = ServiceProcess("dequeue", env, credentials=pki.credentials())
    try:
        admin_channel = ServiceProcess("browse", env, credentials=pki.credentials())
        try:
            queue = "tls-rotation"
            admin_pb2_grpc.AdminServiceStub(admin_channel.channel()).CreateQueue(admin_pb2.CreateQueueRequest(queue=queue), timeout=10)
        finally:
            admin_channel.stop()
        stream = StreamConsumer(dequeue_pb2_grpc.DequeueServiceStub(dequeue.channel()), queue, prefetch=4)
        before = served_certificate(dequeue.port, pki.ca)
        assert before == der(env["MAILQUEUE_TLS_CERT_FILE"])
        # Renewal, as cert-manager does it: a new certificate (new key) written over the files.
        pki.issue("renewed", "mailqueue-browse-renewed", "IP:127.0.0.1,DNS:localhost")
        shutil.copy(os.path.join(pki.path, "renewed.key"), env["MAILQUEUE_TLS_KEY_FILE"])
        shutil.copy(os.path.join(pki.path, "renewed.crt"), env["MAILQUEUE_TLS_CERT_FILE"])
        wait_until(lambda: served_certificate(dequeue.port, pki.ca) == der(env["MAILQUEUE_TLS_CERT_FILE"]), 10,
                   what="new connections get the renewed certificate")
        assert dequeue.proc.poll() is None  # same process
        # The stream opened before the renewal still delivers; the enqueue goes over a new connection.
        enqueue_pb2_grpc.EnqueueServiceStub(enqueue.channel()).Enqueue(inline(queue, simple_mail("after-renewal")), timeout=10)
        d = stream.next(timeout=20)
        assert d.mail.mail.name == "after-renewal"
        stream.answer(d)
        stream.close()
    finally:
        enqueue.stop()
        dequeue.stop()


def test_tls_settings_that_do_not_go_together_refuse_to_start(keyspace, pki):
    for extra, words in (({"MAILQUEUE_TLS_CERT_FILE": os.path.join(pki.path, "server.crt")}, "MAILQUEUE_TLS_KEY_FILE"),
                         ({"MAILQUEUE_TLS_IDENTITIES": "spiffe://x=root"}, "identity=role"),
                         ({"MAILQUEUE_TLS_CA_FILE": "/no/such.pem"}, "no such file"),
                         # Files that exist but do not load (grpc's bind failed with no reason, or a handshake did later)
                         ({"MAILQUEUE_TLS_CERT_FILE": os.path.join(pki.path, "server.crt"),
                           "MAILQUEUE_TLS_KEY_FILE": os.path.join(pki.path, "ops.key")}, "do not load as a pair"),
                         ({"MAILQUEUE_TLS_CA_FILE": os.path.join(pki.path, "ops.key")}, "holds no PEM certificate")):
        r = subprocess.run([sys.executable, "-m", "browse_svc"], cwd=ROOT, env={**service_env(keyspace), **extra},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and words in r.stderr, (extra, r.stderr[-500:])


def test_the_go_and_node_client_scenarios_and_grpcurl_run_over_tls(keyspace, running_stack, pki):
    """Clients in other languages, from the protos alone: the Go and Node contract clients
    (MAILQUEUE_TLS_CA) and grpcurl (-cacert) against services that serve TLS."""
    tools = os.path.join(os.path.expanduser("~"), ".cache", "mailqueue-stack", "go-tools")
    env = tls_env(keyspace, pki)
    processes = {name: ServiceProcess(name, env, credentials=pki.credentials()) for name in ("enqueue", "dequeue", "browse")}
    try:
        targets = {f"MAILQUEUE_{name.upper()}_TARGET": p.target for name, p in processes.items()}
        r = subprocess.run(["go", "test", "-count=1", "-v", "./..."], cwd=os.path.join(ROOT, "tests", "contract", "go"),
                           env={**os.environ, **targets, "MAILQUEUE_TLS_CA": pki.ca}, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "--- PASS: TestScenarios/" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        r = subprocess.run(["node", "--test", "contract.test.mjs"], cwd=os.path.join(ROOT, "tests", "contract", "node"),
                           env={**os.environ, **targets, "MAILQUEUE_TLS_CA": pki.ca}, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "# fail 0" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        browse = processes["browse"].target
        r = subprocess.run([os.path.join(tools, "grpcurl"), "-cacert", pki.ca, browse, "list"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "mailqueue.v1.BrowseService" in r.stdout, r.stderr
        r = subprocess.run([os.path.join(tools, "grpcurl"), "-plaintext", browse, "list"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0  # plaintext to a TLS server
    finally:
        for p in processes.values():
            p.stop()
