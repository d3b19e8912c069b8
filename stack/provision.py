"""One least-privilege credential per component, on every backend: made once, applied idempotently.

    python stack/provision.py credentials DIR        make what is missing under DIR/<role>/
    python stack/provision.py cassandra DIR HOST:PORT CA [--replication N]
    python stack/provision.py minio DIR ENDPOINT CA BUCKET_PATTERN...
    python stack/provision.py rabbitmq-users-eval DIR   print one Erlang expression for rabbitmqctl eval that
                                                      makes every user, its permissions and tags (one call:
                                                      each rabbitmqctl start costs 1-3 s on a busy machine)

DIR/<role>/ holds one file per key, the shape of a Kubernetes Secret mounted as a folder
(MAILQUEUE_CREDENTIALS_DIR): cassandra-username, cassandra-password, rabbitmq-username,
rabbitmq-password, s3-access-key, s3-secret-key; only the backends the role uses. Files are 0600
and never appear on a command line or in a log.

Who may do what (docs/pages/deploying/security.md):

- Cassandra: each service's role has SELECT and MODIFY on the keyspace, granted by the schema step
  (services/runtime/migrate.py) run with the schema role, which owns the keyspace. No service may
  create, alter or drop anything. The operator role is the superuser; the default ``cassandra``
  superuser is dropped.
- RabbitMQ: enqueue declares the topology and publishes, and may not consume a work queue;
  dequeue consumes and publishes retries, and may not declare or delete anything (no configure
  permission); browse (admin: drop, move, replay) may do all three on ``mailqueue.*``; webhook
  may only read the event streams. guest is deleted.
- S3: enqueue and blob put and get blobs; dequeue and browse get them; every role may list the
  bucket (S3 answers 403 instead of 404 for a missing key otherwise); only the sweep and blob_svc
  (its BlobService.Delete, which only the admin role may call) delete blobs. Nobody but the operator (MinIO's root) creates or removes a bucket.
"""

from __future__ import annotations

import os
import secrets
import sys

#: role -> the backends it uses.
ROLES: dict[str, tuple[str, ...]] = {
    "enqueue": ("cassandra", "rabbitmq", "s3"),
    "dequeue": ("cassandra", "rabbitmq", "s3"),
    "browse": ("cassandra", "rabbitmq", "s3"),
    "blob": ("cassandra", "s3"),
    "webhook": ("cassandra", "rabbitmq"),
    "sweep": ("cassandra", "s3"),
    "schema": ("cassandra",),
    "operator": ("cassandra", "rabbitmq", "s3"),
}
#: RabbitMQ permissions (configure, write, read) on the default vhost: regular expressions over
#: exchange and queue names. Work queues are mailqueue.<queue>.work[.high|.low].
_ANY = r"^mailqueue\."
_NOT_WORK = r"^mailqueue\.(?!.*\.work(\.high|\.low)?$)"
RABBITMQ: dict[str, tuple[str, str, str, str]] = {
    "enqueue": (_ANY, _ANY, _NOT_WORK, ""),
    "dequeue": ("^$", _ANY, _ANY, ""),
    "browse": (_ANY, _ANY, _ANY, ""),
    # webhook_svc only consumes the event streams (mailqueue._events.<keyspace>, declared by browse_svc).
    "webhook": ("^$", "^$", r"^mailqueue\._events\.", ""),
    "operator": (".*", ".*", ".*", "administrator"),
}
#: S3 actions per role, on the blobs of the buckets (and, for the sweep, the bucket's listing and
#: its owner marker, spark/buckets.py).
S3: dict[str, tuple[str, ...]] = {
    "enqueue": ("s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"),
    "dequeue": ("s3:GetObject",),
    "browse": ("s3:GetObject",),
    # BlobService.Delete (role admin only) is blob_svc's: it may delete blobs too.
    "blob": ("s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload", "s3:DeleteObject"),
    # HEAD (each blob's age read again just before its delete) needs s3:GetObject.
    "sweep": ("s3:GetObject", "s3:DeleteObject"),
}


def cassandra_role(role: str) -> str:
    return f"mailqueue_{role}"


def user(role: str) -> str:
    return f"mailqueue-{role}"


def _read(folder: str, role: str, key: str) -> str:
    with open(os.path.join(folder, role, key)) as f:
        return f.read().strip()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)


def credentials(folder: str) -> None:
    for role, backends in ROLES.items():
        d = os.path.join(folder, role)
        os.makedirs(d, mode=0o700, exist_ok=True)
        wanted = {}
        if "cassandra" in backends:
            wanted |= {"cassandra-username": cassandra_role(role), "cassandra-password": secrets.token_urlsafe(24)}
        if "rabbitmq" in backends:
            wanted |= {"rabbitmq-username": user(role), "rabbitmq-password": secrets.token_urlsafe(24)}
        if "s3" in backends:
            wanted |= {"s3-access-key": user(role), "s3-secret-key": secrets.token_urlsafe(24)}
        for key, value in wanted.items():
            path = os.path.join(d, key)
            if not os.path.exists(path):
                _write(path, value)


def _cassandra_session(hosts: str | list[str], port: int, ca: str, username: str, password: str,  # noqa: ANN202
                       policy: object = None, timeout: float = 10):
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile

    from services.adapters.cassandra.session import tls_context
    from services.adapters.cassandra.settings import CassandraSettings

    profiles = {EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=policy)} if policy else {}
    cluster = Cluster([hosts] if isinstance(hosts, str) else hosts, port=port, protocol_version=5, connect_timeout=timeout, execution_profiles=profiles,
                      ssl_context=tls_context(CassandraSettings(ca_file=ca)),
                      auth_provider=PlainTextAuthProvider(username, password))
    return cluster, cluster.connect()


#: How long a new cluster may take to let its default superuser log in.
DEFAULT_SUPERUSER_WAIT_S = 150.0


def _default_superuser(host: str, port: int, ca: str):  # noqa: ANN202 - (Cluster, Session)
    """A session as the default superuser of a new cluster, once it may log in. A node of a ring
    still forming creates that role late, and a login tried before caches its absence for up to
    the roles cache's validity (60 s): "cassandra is not permitted to log in" (seen once on a
    clean-clone run's 3-node cluster). So the login is retried, every 5 s, for
    DEFAULT_SUPERUSER_WAIT_S."""
    import time

    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    deadline = time.monotonic() + DEFAULT_SUPERUSER_WAIT_S
    while True:
        try:
            return _cassandra_session(host, port, ca, "cassandra", "cassandra")
        except (NoHostAvailable, AuthenticationFailed) as e:
            if time.monotonic() > deadline:
                raise
            print(f"[stack] cassandra: the default superuser may not log in yet, retrying in 5 s ({str(e)[:160]})",
                  file=sys.stderr, flush=True)
            time.sleep(5)


def cassandra(folder: str, address: str, ca: str, replication: int) -> None:
    """The roles, their passwords, the schema role's CREATE; the default superuser dropped."""
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    host, _, port = address.rpartition(":")
    operator, password = cassandra_role("operator"), _read(folder, "operator", "cassandra-password")
    try:
        cluster, session = _cassandra_session(host, int(port), ca, operator, password)
    except (NoHostAvailable, AuthenticationFailed):
        # A new cluster: only the default superuser exists. Make ours with it, then leave it.
        cluster, session = _default_superuser(host, int(port), ca)
        if replication > 1:
            session.execute("ALTER KEYSPACE system_auth WITH replication = "
                            f"{{'class': 'NetworkTopologyStrategy', 'datacenter1': {replication}}}", timeout=60)
        session.execute(f"CREATE ROLE IF NOT EXISTS {operator} WITH SUPERUSER = true AND LOGIN = true "
                        f"AND PASSWORD = '{password}'", timeout=60)
        cluster.shutdown()
        cluster, session = _cassandra_session(host, int(port), ca, operator, password)
    try:
        session.execute("DROP ROLE IF EXISTS cassandra", timeout=60)
        for role, backends in ROLES.items():
            if "cassandra" not in backends or role == "operator":
                continue
            name, pw = cassandra_role(role), _read(folder, role, "cassandra-password")
            session.execute(f"CREATE ROLE IF NOT EXISTS {name} WITH LOGIN = true AND PASSWORD = '{pw}'", timeout=60)
        # The schema role creates keyspaces (and so owns them: it grants the services theirs).
        session.execute(f"GRANT CREATE ON ALL KEYSPACES TO {cassandra_role('schema')}", timeout=60)
    finally:
        cluster.shutdown()


def _logged_in(folder: str, hosts: list[str], port: int, ca: str, policy: object = None):  # noqa: ANN202
    """A session as the operator role, or (a new cluster, not provisioned yet) as the default
    superuser; SystemExit when no node answers."""
    from cassandra.cluster import NoHostAvailable

    tries = [("cassandra", "cassandra")]
    if os.path.exists(os.path.join(folder, "operator", "cassandra-password")):
        tries.insert(0, (cassandra_role("operator"), _read(folder, "operator", "cassandra-password")))
    last: Exception | None = None
    for username, password in tries:
        try:
            return _cassandra_session(hosts, port, ca, username, password, policy, timeout=2)
        except NoHostAvailable as e:
            last = e
    raise SystemExit(f"cassandra at {','.join(hosts)}:{port} does not answer: {last}")


def cassandra_ping(folder: str, address: str, ca: str) -> None:
    """The node itself answers CQL over TLS (no other node for it). Prints its version."""
    from cassandra.policies import WhiteListRoundRobinPolicy

    host, _, port = address.rpartition(":")
    cluster, session = _logged_in(folder, [host], int(port), ca, WhiteListRoundRobinPolicy([host]))
    try:
        print(session.execute("SELECT release_version FROM system.local", timeout=5).one()[0])
    finally:
        cluster.shutdown()


def cassandra_ring(folder: str, hosts: str, port: int, ca: str) -> None:
    """Every node of the ring is up, as the driver sees it. Prints their addresses."""
    cluster, _ = _logged_in(folder, hosts.split(","), port, ca)
    try:
        up = sorted(h.address for h in cluster.metadata.all_hosts() if h.is_up)
    finally:
        cluster.shutdown()
    print(" ".join(up))
    if len(up) != len(hosts.split(",")):
        raise SystemExit(1)


def _policy(actions: tuple[str, ...], buckets: list[str], role: str) -> dict:
    statements = [{"Effect": "Allow", "Action": list(actions),
                   "Resource": [f"arn:aws:s3:::{b}/blobs/*" for b in buckets]},
                  # Every role's health check (services/adapters/s3/client.py: Bucket.located).
                  {"Effect": "Allow", "Action": ["s3:GetBucketLocation"],
                   "Resource": [f"arn:aws:s3:::{b}" for b in buckets]}]
    # Listing: S3 answers 403, not 404, for a missing key to a user that may not list the bucket,
    # and a reader must tell a blob that is gone (the mail is dead-lettered) from a refusal (an
    # outage to retry). So readers may list; still only the sweep may delete.
    statements.append({"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{b}" for b in buckets]})
    if role == "sweep":
        statements.append({"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
                           "Resource": [f"arn:aws:s3:::{b}/mailqueue-owner" for b in buckets]})
    return {"Version": "2012-10-17", "Statement": statements}


def minio(folder: str, endpoint: str, ca: str, buckets: list[str]) -> None:
    """A user and a policy per role (MinIO's admin API); the operator is MinIO's root."""
    import urllib3
    from minio.credentials import StaticProvider
    from minio.minioadmin import MinioAdmin

    # No CA: a plaintext MinIO on loopback (stack.sh up --plaintext-loopback, the TLS benchmark's baseline).
    secure = bool(ca)
    http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=ca) if secure else urllib3.PoolManager()
    admin = MinioAdmin(endpoint=endpoint, secure=secure, http_client=http, credentials=StaticProvider(
        _read(folder, "operator", "s3-access-key"), _read(folder, "operator", "s3-secret-key")))
    from minio import Minio

    root = Minio(endpoint, access_key=_read(folder, "operator", "s3-access-key"),
                 secret_key=_read(folder, "operator", "s3-secret-key"), secure=secure, http_client=http)
    for bucket in buckets:
        if "*" not in bucket and not root.bucket_exists(bucket):
            root.make_bucket(bucket)
    for role, actions in S3.items():
        name = user(role)
        admin.policy_add(name, policy=_policy(actions, buckets, role))
        admin.user_add(name, _read(folder, role, "s3-secret-key"))
        try:
            admin.attach_policy([name], user=name)
        except Exception as e:  # noqa: BLE001 - attaching a policy already attached is refused
            if "already" not in str(e).lower():
                raise


def _erlang_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _erlang_binary(text: str) -> str:
    return "<<" + _erlang_string(text) + ">>"


def rabbitmq_users_eval(folder: str) -> None:
    users = []
    for role, (configure, write, read, tags) in RABBITMQ.items():
        password_file = os.path.abspath(os.path.join(folder, role, "rabbitmq-password"))
        fields = [_erlang_binary(user(role)), _erlang_string(password_file),
                  *(_erlang_binary(p) for p in (configure, write, read)), "[" + ",".join(tags.split()) + "]"]
        users.append("{" + ", ".join(fields) + "}")
    print("M = rabbit_auth_backend_internal, A = <<\"stack\">>, lists:foreach(fun({U, F, C, W, R, T}) ->"
          " {ok, P} = file:read_file(F), Pw = string:trim(P),"
          " case M:lookup_user(U) of {ok, _} -> M:change_password(U, Pw, A); _ -> M:add_user(U, Pw, A) end,"
          " ok = M:set_permissions(U, <<\"/\">>, C, W, R, A), ok = M:set_tags(U, T, A) end, ["
          + ", ".join(users) + "]), case M:lookup_user(<<\"guest\">>) of {ok, _} -> M:delete_user(<<\"guest\">>, A); _ -> ok end, ok.")


def main(argv: list[str]) -> int:
    command, folder, *rest = argv
    if command == "credentials":
        credentials(folder)
    elif command == "cassandra":
        address, ca, *more = rest
        replication = int(more[1]) if more[:1] == ["--replication"] else 1
        cassandra(folder, address, ca, replication)
    elif command == "minio":
        endpoint, ca, *buckets = rest
        minio(folder, endpoint, ca, buckets)
    elif command == "cassandra-ping":
        address, ca = rest
        cassandra_ping(folder, address, ca)
    elif command == "cassandra-ring":
        hosts, port, ca = rest
        cassandra_ring(folder, hosts, int(port), ca)
    elif command == "rabbitmq-users-eval":
        rabbitmq_users_eval(folder)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1:]))
