"""What a service's server is configured with: where it listens, TLS, tokens, its background
rounds. Plain values; services/runtime/settings.py builds them from the environment and
describes each variable."""

from __future__ import annotations

import dataclasses

#: The roles a token can have (services/runtime/auth.py says who may call what).
ROLES = ("producer", "consumer", "reader", "admin")

#: Default gRPC and metrics ports per service (DESIGN §7).
DEFAULT_PORTS = {"enqueue": 50051, "dequeue": 50052, "browse": 50053, "blob": 50054}
#: The same for every server process, the ones mailq does not call included (webhook_svc serves
#: health, reflection and metrics only).
SERVICE_PORTS = {**DEFAULT_PORTS, "webhook": 50055}
METRICS_PORT_OFFSET = 1000  # enqueue metrics on 51051, and so on


@dataclasses.dataclass(frozen=True)
class TLSSettings:
    """gRPC over TLS. Server side: this service's certificate chain and key (PEM files, reread when
    they change: rotation needs no restart), and with ``client_ca_file`` mutual TLS: client
    certificates from that CA are required, and ``identities`` map theirs to roles. Client side
    (this service's calls to blob_svc): ``ca_file`` is the CA that signs the servers it calls; it
    presents its own certificate when it has one."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""
    identities: dict[str, str] = dataclasses.field(default_factory=dict)
    ca_file: str = ""

    @property
    def serving(self) -> bool:
        return bool(self.cert_file)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    service: str
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    max_connection_age_s: int = 300
    shutdown_grace_s: float = 10.0
    lameduck_s: float = 0.0
    blob_target: str = ""
    log_level: str = "INFO"
    tokens: dict[str, str] = dataclasses.field(default_factory=dict)
    service_token: str = ""
    tls: TLSSettings = dataclasses.field(default_factory=TLSSettings)
    plaintext: bool = False
    health_port: int = 0
    gauge_interval_s: float = 15.0
    heal_interval_s: float = 300.0
    heal_grace_s: float = 900.0
    heal_rows_per_round: int = 20_000
    #: Processes serving this service's port (services/runtime/workers.py); 1: this process alone.
    workers: int = 1
    #: In one of those processes: its index (1..workers), set by their supervisor; 0 otherwise.
    worker: int = 0
    #: Start-up's objects frozen and young collections spaced out once serving (services/runtime/heap.py).
    gc_tuned: bool = True
