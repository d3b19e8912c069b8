"""Configuration: one typed value per component, built from the environment.

Every MAILQUEUE_* variable of a service, its default and its meaning is here (the comment above
the line that reads it) and in docs/pages/reference/settings.md (a unit test checks); nothing else in a service reads its settings
from ``os.environ`` (the schema tool, services/runtime/migrate.py, and the Spark sweep, spark/,
read a few of their own). Defaults are the safe local ones (loopback, one replica).

The values live with the code that uses them: CassandraSettings, RabbitMQSettings and S3Settings
next to their adapters (services/adapters/*/settings.py), LimitSettings and ViewSettings in
services/domain/settings.py, ServerSettings and TLSSettings in services/runtime/server_settings.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import re
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from services.adapters.cassandra.settings import CassandraSettings
from services.adapters.rabbitmq.settings import RabbitMQSettings
from services.adapters.s3.settings import S3Settings
from services.domain import quotas
from services.domain.errors import ConfigurationError
from services.domain.settings import EventSettings, LimitSettings, ViewSettings
from services.runtime.logs import LOG_LEVELS
from services.runtime.server_settings import METRICS_PORT_OFFSET, ROLES, SERVICE_PORTS, ServerSettings, TLSSettings


def _get(env: Mapping[str, str], name: str, default: str) -> str:
    return env.get(f"MAILQUEUE_{name}", default)


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = _get(env, name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"MAILQUEUE_{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigurationError(f"MAILQUEUE_{name}={value} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(f"MAILQUEUE_{name}={value} must be <= {maximum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = _get(env, name, str(default))
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"MAILQUEUE_{name}={raw!r} is not a number (seconds)") from None
    if not value >= minimum or value == float("inf"):
        raise ConfigurationError(f"MAILQUEUE_{name}={raw} must be a finite number >= {minimum}")
    return value


def _optional_int(env: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    return _int(env, name, 0, minimum) if f"MAILQUEUE_{name}" in env else None


def _file(env: Mapping[str, str], name: str) -> str:
    """A path setting: "" when unset; a path that is not a file is refused at start-up."""
    path = _get(env, name, "")
    if path and not os.path.isfile(path):
        raise ConfigurationError(f"MAILQUEUE_{name}={path}: no such file")
    return path


def _ca_file(env: Mapping[str, str], name: str) -> str:
    """A CA certificate file (a backend's): refused at start-up unless it loads as PEM, not on the
    first connection with a traceback (a crash loop under a supervisor)."""
    path = _file(env, name)
    if path:
        try:
            ssl.create_default_context(cafile=path)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise ConfigurationError(f"MAILQUEUE_{name}={path} holds no PEM certificate ({e}): give the CA certificate") from None
    return path


def _credential(env: Mapping[str, str], file_name: str, variable: str, default: str | None) -> str | None:
    """A credential: the file ``file_name`` of MAILQUEUE_CREDENTIALS_DIR (a mounted Secret: one file
    per key) when it is there, else MAILQUEUE_<variable>, else ``default``. Files keep secrets out
    of command lines, process listings and logs."""
    folder = env.get("MAILQUEUE_CREDENTIALS_DIR")
    from_env = env.get(f"MAILQUEUE_{variable}")  # read either way: a file may override it, it is no misspelling
    if folder:
        if not os.path.isdir(folder):  # else every backend's default login (guest, minioadmin) is tried, and refused
            raise ConfigurationError(f"MAILQUEUE_CREDENTIALS_DIR={folder!r} is not a folder: mount the service's "
                                     "credentials Secret there (one file per key), or unset it")
        path = os.path.join(folder, file_name)
        try:
            with open(path) as f:
                value = f.read().strip()
        except FileNotFoundError:
            value = None
        except OSError as e:
            raise ConfigurationError(f"MAILQUEUE_CREDENTIALS_DIR: {path}: {e.strerror}") from e
        if value == "":  # else the backend's default login would be tried in its place
            raise ConfigurationError(f"MAILQUEUE_CREDENTIALS_DIR: {path} is empty: put the {file_name} in it, or remove the file")
        if value is not None:
            return value
    return from_env or default


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(env, name, "true" if default else "false").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"MAILQUEUE_{name}={raw!r} is not a boolean (true/false)")


def cassandra_from_env(env: Mapping[str, str] = os.environ) -> CassandraSettings:
    return CassandraSettings(
        hosts=tuple(h.strip() for h in _get(env, "CASSANDRA_HOSTS", "127.0.0.1").split(",") if h.strip()),
        port=_int(env, "CASSANDRA_PORT", 9042, 1),
        keyspace=_get(env, "CASSANDRA_KEYSPACE", "mailqueue"),
        #: CQL replication map for the keyspace, e.g. {'class': 'NetworkTopologyStrategy', 'dc1': 3}.
        replication=_get(env, "CASSANDRA_REPLICATION", CassandraSettings.replication),
        local_dc=env.get("MAILQUEUE_CASSANDRA_LOCAL_DC") or None,
        username=_credential(env, "cassandra-username", "CASSANDRA_USERNAME", None),
        password=_credential(env, "cassandra-password", "CASSANDRA_PASSWORD", None),
        #: CA that signs the nodes' certificates: when set, every connection is TLS (client encryption).
        ca_file=_ca_file(env, "CASSANDRA_CA_FILE"),
        request_timeout_s=_float(env, "CASSANDRA_TIMEOUT_S", 5.0, 0.001),
        #: Seconds queue counter updates are gathered in the process before they are written (0: at once).
        counter_flush_s=_float(env, "COUNTER_FLUSH_S", 1.0),
    )


def rabbitmq_from_env(env: Mapping[str, str] = os.environ) -> RabbitMQSettings:
    #: "quorum" (replicated, default) or "classic".
    queue_type = _get(env, "RABBITMQ_QUEUE_TYPE", "quorum")
    if queue_type not in ("quorum", "classic"):
        raise ConfigurationError(f"MAILQUEUE_RABBITMQ_QUEUE_TYPE={queue_type!r}: use quorum or classic")
    return RabbitMQSettings(
        #: The broker's nodes: a service connects to the first that answers and, when its node dies,
        #: to the next (MAILQUEUE_RABBITMQ_URLS, comma separated; or one MAILQUEUE_RABBITMQ_URL).
        urls=with_credentials(broker_urls(env), _credential(env, "rabbitmq-username", "RABBITMQ_USERNAME", None),
                              _credential(env, "rabbitmq-password", "RABBITMQ_PASSWORD", None)),
        #: CA that signs the nodes' certificates, for amqps:// URLs.
        ca_file=_ca_file(env, "RABBITMQ_CA_FILE"),
        queue_type=queue_type,
        #: Deliveries of one message before a quorum queue dead-letters it (poison messages).
        delivery_limit=_int(env, "RABBITMQ_DELIVERY_LIMIT", 20, 1),
        connect_timeout_s=_float(env, "RABBITMQ_CONNECT_TIMEOUT_S", 5.0, 0.001),
        #: AMQP heartbeat: a node that stops answering (hung, partitioned) is left after about twice this.
        heartbeat_s=_int(env, "RABBITMQ_HEARTBEAT_S", 5, 1, 600),
        #: A publish not confirmed within this is UNAVAILABLE, and the connection is dropped for another node.
        confirm_timeout_s=_float(env, "RABBITMQ_CONFIRM_TIMEOUT_S", 10.0, 0.1),
        #: The broker's copies of a queue's dead letters (``mailqueue.<q>.dead-letter``) are bounded:
        #: past this many, or this age, the oldest go (the repository keeps every dead letter).
        dead_letter_max=_int(env, "RABBITMQ_DEAD_LETTER_MAX", RabbitMQSettings.dead_letter_max, 1),
        dead_letter_keep_s=_int(env, "RABBITMQ_DEAD_LETTER_KEEP_S", RabbitMQSettings.dead_letter_keep_s, 1, 10 * 365 * 24 * 3600),
        #: The event stream (WatchEvents, webhooks) keeps events this long (RabbitMQ's x-max-age) ...
        event_stream_retention_s=_int(env, "EVENT_STREAM_RETENTION_S", RabbitMQSettings.event_stream_retention_s, 60,
                                      10 * 365 * 24 * 3600),
        #: ... and at most this many bytes (x-max-length-bytes): the oldest segments go first.
        event_stream_max_bytes=_int(env, "EVENT_STREAM_MAX_BYTES", RabbitMQSettings.event_stream_max_bytes, 1024**2),
        event_watchers_max=_int(env, "EVENT_WATCHERS_MAX", RabbitMQSettings.event_watchers_max, 1, 1500),
    )


def with_credentials(urls: tuple[str, ...], username: str | None, password: str | None) -> tuple[str, ...]:
    """The URLs with this service's user and password (from MAILQUEUE_CREDENTIALS_DIR or
    MAILQUEUE_RABBITMQ_USERNAME/_PASSWORD) in place of the ones they carry."""
    if not username:
        return urls
    from urllib.parse import quote, urlsplit, urlunsplit

    out = []
    for u in urls:
        parts = urlsplit(u)
        host = parts.netloc.rpartition("@")[2]
        userinfo = quote(username, safe="") + (":" + quote(password, safe="") if password else "")
        out.append(urlunsplit(parts._replace(netloc=f"{userinfo}@{host}")))
    return tuple(out)


def broker_urls(env: Mapping[str, str]) -> tuple[str, ...]:
    """MAILQUEUE_RABBITMQ_URLS (several nodes, comma separated) or MAILQUEUE_RABBITMQ_URL (one)."""
    many, one = env.get("MAILQUEUE_RABBITMQ_URLS"), env.get("MAILQUEUE_RABBITMQ_URL")
    if many and one:
        raise ConfigurationError("set MAILQUEUE_RABBITMQ_URLS or MAILQUEUE_RABBITMQ_URL, not both")
    if not many:
        if one and not one.startswith(("amqp://", "amqps://")):
            raise ConfigurationError(f"MAILQUEUE_RABBITMQ_URL: {one.split('@')[-1]!r} is not an amqp:// or amqps:// URL "
                                     "(amqps://host:5671/%2F)")
        return (one or RabbitMQSettings.urls[0],)
    urls = tuple(u.strip() for u in many.split(",") if u.strip())
    for u in urls:
        if not u.startswith(("amqp://", "amqps://")):
            raise ConfigurationError(
                f"MAILQUEUE_RABBITMQ_URLS: {u.split('@')[-1]!r} is not an amqp:// or amqps:// URL "
                "(separate URLs with commas; a comma inside a password is written %2C)"
            )
    if not urls:
        raise ConfigurationError("MAILQUEUE_RABBITMQ_URLS is empty")
    return urls


def s3_from_env(env: Mapping[str, str] = os.environ) -> S3Settings:
    return S3Settings(
        endpoint=_get(env, "S3_ENDPOINT", S3Settings.endpoint),
        access_key=_credential(env, "s3-access-key", "S3_ACCESS_KEY", S3Settings.access_key) or S3Settings.access_key,
        secret_key=_credential(env, "s3-secret-key", "S3_SECRET_KEY", S3Settings.secret_key) or S3Settings.secret_key,
        bucket=_get(env, "S3_BUCKET", S3Settings.bucket),
        secure=_bool(env, "S3_SECURE", False) or bool(_get(env, "S3_CA_FILE", "")),
        #: CA that signs S3's certificate (implies ``secure``); unset: the system's CAs.
        ca_file=_ca_file(env, "S3_CA_FILE"),
        region=env.get("MAILQUEUE_S3_REGION") or None,
        #: HTTP connections kept to S3 (and threads that call S3: one per connection).
        pool_size=_int(env, "S3_POOL_SIZE", 64, 1),
        #: Folder where streamed puts are spooled while their hash is computed.
        spool_dir=env.get("MAILQUEUE_SPOOL_DIR") or None,
        #: A blob that a put deduplicates onto gets its modification time refreshed at most this
        #: often (seconds), so the retention sweep sees it as young; keep it well below the sweep's
        #: blob grace.
        touch_interval_s=_int(env, "S3_TOUCH_INTERVAL_S", 60),
    )


def limits_from_env(env: Mapping[str, str] = os.environ) -> LimitSettings:
    """Input limits: a request beyond any of them is refused and writes nothing."""
    return LimitSettings(
        max_inline_bytes=_int(env, "MAX_INLINE_BYTES", LimitSettings.max_inline_bytes, 1),
        max_mail_bytes=_int(env, "MAX_MAIL_BYTES", LimitSettings.max_mail_bytes, 1),
        max_blob_bytes=_int(env, "MAX_BLOB_BYTES", LimitSettings.max_blob_bytes, 1),
        max_recipients=_int(env, "MAX_RECIPIENTS", LimitSettings.max_recipients, 1),
        max_attributes=_int(env, "MAX_ATTRIBUTES", LimitSettings.max_attributes, 0),
        max_attribute_bytes=_int(env, "MAX_ATTRIBUTE_BYTES", LimitSettings.max_attribute_bytes, 1),
        max_metadata_bytes=_int(env, "MAX_METADATA_BYTES", LimitSettings.max_metadata_bytes, 1),
        #: Deliveries up to this size carry their content inline; larger ones are read from blob_svc.
        dequeue_inline_bytes=_int(env, "DEQUEUE_INLINE_BYTES", LimitSettings.dequeue_inline_bytes, 0, LimitSettings.DEQUEUE_INLINE_MAX),
        max_prefetch=_int(env, "MAX_PREFETCH", LimitSettings.max_prefetch, 1),
        #: Blobs up to this size live in Cassandra (no S3 object, no blob_svc hop); 0 puts every blob in S3.
        small_blob_bytes=_int(env, "SMALL_BLOB_BYTES", LimitSettings.small_blob_bytes, 0, LimitSettings.SMALL_BLOB_MAX),
        #: An idempotency claim left uncommitted this long is taken over by a retry with the key (with
        #: its enqueue id) even though its enqueuer still holds its lease. Longer than any enqueue takes.
        abandoned_claim_s=_float(env, "ABANDONED_CLAIM_S", LimitSettings.abandoned_claim_s, 1.0),
        #: Each enqueue process's lease (seconds, renewed every third of it): a claim whose owner's
        #: lease is gone (the process died) is taken over by the next retry with the key.
        claim_lease_s=_int(env, "CLAIM_LEASE_S", LimitSettings.claim_lease_s, 2),
    )


#: MAILQUEUE_EVENTS values that record in part, only to measure (bench.events_bench --modes).
MEASURED_EVENT_SINKS = ("history", "unwritten", "stream")


def events_from_env(env: Mapping[str, str] = os.environ) -> EventSettings:
    """Events and the mail history (docs/pages/concepts/events.md)."""
    raw = _get(env, "EVENTS", "true").strip().lower()
    sinks = raw if raw in MEASURED_EVENT_SINKS else "all"
    return EventSettings(
        #: MAILQUEUE_EVENTS=off records nothing (to measure the cost of events; bench/); "history",
        #: "stream" and "unwritten" record in part, to measure what each part costs (EventSettings.sinks).
        enabled=sinks != "all" or _bool(env, "EVENTS", True),
        sinks=sinks,
        #: Seconds each history row is kept (its TTL); the history of a mail older than that is gone.
        history_retention_s=_int(env, "HISTORY_RETENTION_S", EventSettings.history_retention_s, 60),
        #: A HANDED_OUT event is written with the answer's when the answer comes within this; 0: before sending.
        handout_delay_ms=_int(env, "HANDOUT_EVENT_DELAY_MS", EventSettings.handout_delay_ms, 0, 60_000),
    )


def view_from_env(env: Mapping[str, str] = os.environ) -> ViewSettings:
    """The wanted view configuration; unset fields keep what is stored (or the defaults)."""
    return ViewSettings(
        slice_window_s=_optional_int(env, "SLICE_WINDOW_S"),
        bucket_count=_optional_int(env, "BUCKET_COUNT"),
        update_browse_start_pace=_optional_int(env, "BROWSE_START_PACE"),
    )


def _role_ok(role: str) -> bool:
    """A role, or ``role@tenant`` (the tenant whose enqueue quotas the caller's mails count
    towards: services/domain/quotas.py)."""
    name, at, tenant = role.partition("@")
    return name in ROLES and (not at or quotas.is_tenant(tenant))


#: A token given by its digest: ``sha256:`` and the 64 hex digits of the SHA-256 of the token.
TOKEN_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")


def token_digest(token: str) -> str:
    """What a service keeps of a token: the hex SHA-256 of its text (``printf %s "$TOKEN" | sha256sum``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_tokens(spec: str) -> dict[str, str]:
    """``"admin:sha256:<hex>,producer@acme:abc..."`` -> {the token's SHA-256 in hex: role or
    role@tenant}. A token is given as itself or as ``sha256:`` and its digest: a service needs only
    the digests (a pod that holds them holds no token a caller could present). Raises
    ConfigurationError."""
    tokens: dict[str, str] = {}
    for n, item in enumerate(filter(None, (part.strip() for part in spec.replace("\n", ",").split(","))), 1):
        role, sep, token = item.partition(":")
        digest = TOKEN_DIGEST.fullmatch(token)
        if not sep or not _role_ok(role) or (len(token) < 16 or token.startswith("sha256:")) and digest is None:
            # Never the entry's text: a mistyped separator would put the token in the log.
            shown = f" (role {role.partition('@')[0]!r})" if sep and _role_ok(role) else ""  # not its tenant: text after a typo
            raise ConfigurationError(
                f"MAILQUEUE_TOKENS entry {n}{shown}: use role:token or role:sha256:<the token's SHA-256 in 64 hex digits> "
                f"(or role@tenant:...) with a role of {', '.join(ROLES)} and a token of at least 16 characters"
            )
        tokens[digest.group(1).lower() if digest else token_digest(token)] = role
    return tokens


def parse_identities(spec: str) -> dict[str, str]:
    """``"spiffe://mailqueue/ops=admin,spiffe://acme/mta=producer@acme"`` -> {client certificate
    identity: role or role@tenant}
    (an identity is a URI SAN or a CN). Raises ConfigurationError."""
    identities: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        identity, sep, role = item.rpartition("=")
        if not sep or not identity or not _role_ok(role):
            raise ConfigurationError(
                f"MAILQUEUE_TLS_IDENTITIES entry {item!r}: use identity=role or identity=role@tenant (a URI SAN or CN of the client "
                f"certificate) with a role of {', '.join(ROLES)}"
            )
        identities[identity] = role
    return identities


def tls_from_env(env: Mapping[str, str] = os.environ) -> TLSSettings:
    """gRPC over TLS (services/runtime/server_settings.py says what each file is for)."""
    t = TLSSettings(
        cert_file=_get(env, "TLS_CERT_FILE", ""), key_file=_get(env, "TLS_KEY_FILE", ""),
        client_ca_file=_get(env, "TLS_CLIENT_CA_FILE", ""),
        identities=parse_identities(_get(env, "TLS_IDENTITIES", "")), ca_file=_get(env, "TLS_CA_FILE", ""),
    )
    if bool(t.cert_file) != bool(t.key_file):
        raise ConfigurationError("set both MAILQUEUE_TLS_CERT_FILE and MAILQUEUE_TLS_KEY_FILE, or neither")
    if t.client_ca_file and not t.cert_file:
        raise ConfigurationError("MAILQUEUE_TLS_CLIENT_CA_FILE (mutual TLS) needs MAILQUEUE_TLS_CERT_FILE and _KEY_FILE")
    if t.identities and not t.client_ca_file:
        raise ConfigurationError("MAILQUEUE_TLS_IDENTITIES needs MAILQUEUE_TLS_CLIENT_CA_FILE (client certificates)")
    for name, path in (("TLS_CERT_FILE", t.cert_file), ("TLS_KEY_FILE", t.key_file),
                       ("TLS_CLIENT_CA_FILE", t.client_ca_file), ("TLS_CA_FILE", t.ca_file)):
        if path and not os.path.isfile(path):
            raise ConfigurationError(f"MAILQUEUE_{name}={path}: no such file")
        if path and not os.access(path, os.R_OK):
            raise ConfigurationError(f"MAILQUEUE_{name}={path}: this process may not read it (its owner and mode)")
    _check_tls_files(t)
    return t


def _check_tls_files(t: TLSSettings) -> None:
    """The files load as gRPC will load them: else the server's bind fails with no reason, or a
    client's handshake does, long after the start."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if t.cert_file:
        try:  # an encrypted key is refused, not prompted for (gRPC cannot read one either)
            context.load_cert_chain(t.cert_file, t.key_file, password=lambda: b"")
        except (ssl.SSLError, OSError, ValueError) as e:
            raise ConfigurationError(
                f"MAILQUEUE_TLS_CERT_FILE={t.cert_file} and MAILQUEUE_TLS_KEY_FILE={t.key_file} do not load as a pair ({e}): "
                "give the PEM certificate (its chain after it) and the unencrypted private key it was issued for") from None
    for name, path in (("TLS_CLIENT_CA_FILE", t.client_ca_file), ("TLS_CA_FILE", t.ca_file)):
        if path:
            try:
                context.load_verify_locations(cafile=path)
            except (ssl.SSLError, OSError, ValueError) as e:
                raise ConfigurationError(f"MAILQUEUE_{name}={path} holds no PEM certificate ({e}): give the CA certificate") from None


def _tokens(env: Mapping[str, str]) -> dict[str, str]:
    spec = env.get("MAILQUEUE_TOKENS", "")
    path = env.get("MAILQUEUE_TOKENS_FILE")
    if path:
        try:
            with open(path) as f:
                spec = f"{spec},{f.read()}"
        except OSError as e:
            raise ConfigurationError(f"MAILQUEUE_TOKENS_FILE={path}: {e.strerror}") from e
    return parse_tokens(spec)


def _metrics_port(env: Mapping[str, str], port: int) -> int:
    """MAILQUEUE_METRICS_PORT, by default the port + 1000: refused above 65535 with the variable to
    set (a port past 65535 was taken and wrapped around, or failed to bind with a traceback)."""
    default = port + METRICS_PORT_OFFSET if port else 0
    if "MAILQUEUE_METRICS_PORT" not in env and default > 65535:
        raise ConfigurationError(f"MAILQUEUE_PORT={port}: its metrics port (port + {METRICS_PORT_OFFSET}) would be {default}, "
                                 "above 65535: set MAILQUEUE_METRICS_PORT")
    return _int(env, "METRICS_PORT", default, 0, 65535)


def _log_level(env: Mapping[str, str]) -> str:
    level = _get(env, "LOG_LEVEL", "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigurationError(f"MAILQUEUE_LOG_LEVEL={_get(env, 'LOG_LEVEL', '')!r}: use one of {', '.join(LOG_LEVELS)}")
    return level


def server_from_env(service: str, env: Mapping[str, str] = os.environ) -> ServerSettings:
    port = _int(env, "PORT", SERVICE_PORTS[service], 0, 65535)
    server = ServerSettings(
        service=service,
        host=_get(env, "HOST", "127.0.0.1"),
        port=port,
        metrics_port=_metrics_port(env, port),
        #: Seconds a connection lives before the server asks the client to reconnect (re-resolve).
        max_connection_age_s=_int(env, "MAX_CONNECTION_AGE_S", 300, 1, 2_147_483),  # in ms, a C int
        #: Seconds SIGTERM waits for in-flight RPCs.
        shutdown_grace_s=_float(env, "SHUTDOWN_GRACE_S", 10.0),
        #: Seconds a terminating server keeps serving, NOT_SERVING, before it closes its connections:
        #: clients that balance over a headless Service's DNS answers re-resolve when a connection
        #: closes, and an answer cached before the termination still names this pod until the cluster
        #: DNS's TTL passes (30 s with kubeadm's Corefile). 0 (the default, outside Kubernetes): none.
        lameduck_s=_float(env, "LAMEDUCK_S", 0.0),
        #: Target of blob_svc for enqueue and dequeue's content above the small-blob limit; "" (the
        #: default): they read and write S3 themselves, one hop less (docs/pages/benchmarks.md).
        blob_target=_get(env, "BLOB_TARGET", ""),
        log_level=_log_level(env),
        #: Bearer tokens accepted by this server, the hex SHA-256 of each -> its role (empty: no access control).
        tokens=_tokens(env),
        #: Token this service presents to other services (enqueue/dequeue -> blob_svc).
        service_token=_get(env, "SERVICE_TOKEN", ""),
        tls=tls_from_env(env),
        #: Serve gRPC without TLS: only by this explicit setting, and only on a loopback host
        #: (checked when the server starts: services.runtime.server.check_transport).
        plaintext=_bool(env, "PLAINTEXT", False),
        #: A second, plaintext port that serves only grpc.health (0: none): the kubelet's gRPC probes
        #: do not speak TLS, and this port answers them without opening the API in the clear.
        health_port=_int(env, "HEALTH_PORT", 0, 0, 65535),
        #: browse_svc: seconds between refreshes of the per-queue gauges (0: off).
        gauge_interval_s=_float(env, "GAUGE_INTERVAL_S", 15.0),
        #: browse_svc's healer: a round every this many seconds (0: off), over mails older than the grace.
        heal_interval_s=_float(env, "HEAL_INTERVAL_S", 300.0),
        heal_grace_s=_float(env, "HEAL_GRACE_S", 900.0, 1.0),
        #: Mail rows a healer round reads per queue at most: a deep queue is passed over in several
        #: rounds, so a round costs the same at any depth.
        heal_rows_per_round=_int(env, "HEAL_ROWS_PER_ROUND", 20_000, 100),
        #: Worker processes on the same port (SO_REUSEPORT), under a supervisor that serves their
        #: metrics (services/runtime/workers.py): a pod that can use more than one core.
        workers=_workers(env, port, service),
        #: Set by that supervisor in each worker's environment: the worker's index.
        worker=_int(env, "WORKER", 0, 0),
        #: The collector set for a server once the backends are connected (services/runtime/heap.py);
        #: false: CPython's defaults, as a library would have them.
        gc_tuned=_bool(env, "GC_TUNED", True),
    )
    if server.blob_target and not server.tls.ca_file and not _loopback_target(server.blob_target):
        # In the clear, MAILQUEUE_SERVICE_TOKEN would go to whatever answers on that name.
        raise ConfigurationError(f"MAILQUEUE_BLOB_TARGET={server.blob_target} is not on this machine: set MAILQUEUE_TLS_CA_FILE "
                                 "(the CA that signed blob_svc's certificate), the calls to it are made over TLS only")
    ports = [("MAILQUEUE_PORT", server.port), ("MAILQUEUE_METRICS_PORT", server.metrics_port),
             ("MAILQUEUE_HEALTH_PORT", server.health_port)]
    taken = [(a, b) for n, (a, pa) in enumerate(ports) for b, pb in ports[n + 1:] if pa and pa == pb]
    if taken:  # two listeners on one port: refused here rather than a traceback when the second binds
        raise ConfigurationError(f"{taken[0][0]} and {taken[0][1]} are both {dict(ports)[taken[0][0]]}: give each its own port")
    return server


def _loopback_target(target: str) -> bool:
    """Whether a gRPC target is this machine: "host:port", "dns:///host:port", "unix:path", or
    "ipv4:a:port,b:port" (every address)."""
    if target.startswith("unix:"):
        return True
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            return all(_loopback_address(a) for a in target[len(scheme):].split(","))
    return _loopback_address(target.rsplit("/", 1)[-1])


def _loopback_address(address: str) -> bool:
    """"host:port", "[v6]:port" or a bare host."""
    if address.startswith("["):
        host = address[1:].partition("]")[0]
    else:
        host = address.rpartition(":")[0] if address.count(":") == 1 else address
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _workers(env: Mapping[str, str], port: int, service: str) -> int:
    workers = _int(env, "WORKERS", 1, 1, 64)
    if workers > 1 and service == "webhook":
        raise ConfigurationError("MAILQUEUE_WORKERS must be 1 for webhook_svc: one process delivers each endpoint's events in order")
    if workers > 1 and not port:
        raise ConfigurationError("MAILQUEUE_WORKERS > 1 needs a fixed MAILQUEUE_PORT: the workers share it (0 gives each its own)")
    return workers


def backends_in_the_clear(cassandra: CassandraSettings, rabbitmq: RabbitMQSettings, s3: S3Settings) -> list[str]:
    """Each backend this process would reach unencrypted on another host, with what to set: the
    defaults are a bare local stack's (amqp://guest, minioadmin over HTTP), never a remote one's."""
    said = []
    if not cassandra.ca_file and not all(_loopback_address(h) for h in cassandra.hosts):
        said.append("Cassandra without TLS (set MAILQUEUE_CASSANDRA_CA_FILE)")
    clear = [u for u in rabbitmq.urls if u.startswith("amqp://") and not _loopback_address(urllib.parse.urlsplit(u).hostname or "")]
    if clear:
        said.append("RabbitMQ over amqp:// (use amqps:// and MAILQUEUE_RABBITMQ_CA_FILE)")
    if not s3.secure and not _loopback_address(s3.endpoint):
        said.append("S3 over HTTP (set MAILQUEUE_S3_SECURE=true)")
    return said


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything one service process needs."""

    server: ServerSettings
    cassandra: CassandraSettings
    rabbitmq: RabbitMQSettings
    s3: S3Settings
    limits: LimitSettings
    view: ViewSettings
    events: EventSettings = dataclasses.field(default_factory=EventSettings)
    #: How long a process trusts what it cached of each queue and the view configuration
    #: (services/app/queue_state.py): DeleteQueue waits browse_svc's, at least every other's.
    queue_cache_s: float = 10.0

    #: MAILQUEUE_* variables set but never read, each with the read one it is closest to (a
    #: misspelling: ``misspelled``); the server logs a warning for each at start-up.
    misspelled: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls, service: str, env: Mapping[str, str] = os.environ) -> Settings:
        reads = Reads(env)
        settings = cls._read(service, reads)
        return dataclasses.replace(settings, misspelled=misspelled(env, reads.names))

    @classmethod
    def _read(cls, service: str, env: Mapping[str, str]) -> Settings:
        return cls(
            server=server_from_env(service, env),
            cassandra=cassandra_from_env(env),
            rabbitmq=rabbitmq_from_env(env),
            s3=s3_from_env(env),
            limits=limits_from_env(env),
            view=view_from_env(env),
            events=events_from_env(env),
            queue_cache_s=_float(env, "QUEUE_CACHE_S", cls.queue_cache_s, 0.1),
        )


class Reads(Mapping[str, str]):
    """``env``, remembering every name looked up in it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.names.add(name)
        return self._env[name]

    def get(self, name: str, default: Any = None) -> Any:
        self.names.add(name)
        return self._env.get(name, default)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.names.add(name)
        return name in self._env

    def __iter__(self) -> Iterator[str]:
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)


def misspelled(env: Mapping[str, str], read: set[str]) -> tuple[tuple[str, str], ...]:
    """The MAILQUEUE_* variables of ``env`` not in ``read`` that are one slip away from a name that
    is: as many words, at most two letters added, dropped or changed (``MAILQUEUE_CASANDRA_HOSTS``:
    ``MAILQUEUE_CASSANDRA_HOSTS``), each with that name. Other variables are left alone: the
    stack's scripts, the clients and the other components read their own (``MAILQUEUE_CASSANDRA_HEAP``,
    ``MAILQUEUE_TLS_CA``)."""
    known = sorted(n for n in read if n.startswith("MAILQUEUE_"))
    out = []
    for name in sorted(env):
        if name.startswith("MAILQUEUE_") and name not in read:
            words = name.count("_")
            close = [k for k in known if k.count("_") == words and _edits(name, k, 2) <= 2]
            if close:
                out.append((name, min(close, key=lambda k: _edits(name, k, 2))))
    return tuple(out)


def _edits(a: str, b: str, limit: int) -> int:
    """The edit distance of ``a`` and ``b`` (letters added, dropped or changed), or ``limit + 1``
    once it is over ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]
