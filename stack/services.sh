#!/usr/bin/env bash
# Start, stop or show the four services as local background processes (logs under .stack/logs).
#   stack/services.sh start | stop | status
# They serve gRPC over TLS (the local CA's certificate, stack/pki.sh) and reach the backends over
# TLS, each with its own credential. A client trusts .stack/pki/ca.crt:
#   mailq --tls-ca .stack/pki/ca.crt ...   or   export MAILQ_TLS_CA=.stack/pki/ca.crt
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}"
LOG_DIR="$STACK_DIR/logs"
PY="${MAILQUEUE_PYTHON:-$ROOT/.venv/bin/python}"
SERVICES=(blob:50054 enqueue:50051 dequeue:50052 browse:50053)

# alive PID NAME: the process exists, is not a zombie (killed, not yet reaped) and is NAME_svc
# (a PID reused by another program does not count).
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
  [[ -n $state && $state != Z ]] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- "-m $2_svc"
}
pid_of() { local f="$STACK_DIR/svc-$1.pid"; [[ -f $f ]] && alive "$(cat "$f")" "$1" && cat "$f"; }

PKI_DIR="$STACK_DIR/pki"

serving() {  # serving PORT: gRPC health says SERVING (over TLS, trusting the local CA)
  "$PY" - "$1" "$PKI_DIR/ca.crt" <<'PYEOF' >/dev/null 2>&1
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
creds = grpc.ssl_channel_credentials(open(sys.argv[2], "rb").read())
with grpc.secure_channel(f"127.0.0.1:{sys.argv[1]}", creds) as ch:
    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
PYEOF
}

start() {
  cd "$ROOT"
  mkdir -p "$LOG_DIR"
  for entry in "${SERVICES[@]}"; do
    IFS=: read -r name port <<<"$entry"
    if pid_of "$name" >/dev/null; then continue; fi
    # Each service with its own backend credential (stack/stack.sh env NAME), serving TLS with the
    # local CA's certificate; blob_svc is reached over TLS too.
    ( set -a; eval "$("$ROOT/stack/stack.sh" env "$name")"
      MAILQUEUE_TLS_CERT_FILE="$PKI_DIR/services.crt" MAILQUEUE_TLS_KEY_FILE="$PKI_DIR/services.key"
      exec nohup "$PY" -m "${name}_svc" ) >>"$LOG_DIR/$name.log" 2>&1 &
    echo $! >"$STACK_DIR/svc-$name.pid"
  done
  local start=$SECONDS
  for entry in "${SERVICES[@]}"; do
    IFS=: read -r name port <<<"$entry"
    until serving "$port"; do
      if (( SECONDS - start > 60 )); then
        echo "[services] $name is not SERVING after 60 s: read $LOG_DIR/$name.log" >&2; status; exit 1
      fi
      sleep 0.5
    done
  done
  status
}

stop() {
  for entry in "${SERVICES[@]}"; do
    IFS=: read -r name port <<<"$entry"
    local pid; pid=$(pid_of "$name") || continue
    kill "$pid" 2>/dev/null || true
    local t=$SECONDS
    while alive "$pid" "$name" && (( SECONDS - t < 15 )); do sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$STACK_DIR/svc-$name.pid"
  done
}

status() {
  printf '%-10s %-18s %-8s %-10s %s\n' SERVICE GRPC PID METRICS HEALTH
  for entry in "${SERVICES[@]}"; do
    IFS=: read -r name port <<<"$entry"
    local pid health=SERVING
    pid=$(pid_of "$name") || pid=-
    serving "$port" || health=DOWN
    printf '%-10s %-18s %-8s %-10s %s\n' "$name" "127.0.0.1:$port" "$pid" ":$((port + 1000))" "$health"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
