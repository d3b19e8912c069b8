#!/usr/bin/env bash
# The local stack: real Cassandra, RabbitMQ and MinIO on loopback, no containers.
#
#   stack/stack.sh up        install what is missing (once per machine), start what is down, wait healthy
#   stack/stack.sh down      stop everything this script started
#   stack/stack.sh status    one line per component: port, PID, healthy or not (exit 1 if any is down)
#   stack/stack.sh rabbitmqctl ARGS...   run rabbitmqctl against the local node
#
#   stack/stack.sh up|down|status --cluster   the clusters instead: 3 Cassandra nodes (127.0.0.1-3,
#       CQL port 9142), 3 clustered RabbitMQ nodes (AMQP 5701-5703), a Spark standalone master and two
#       workers, and the same MinIO. Their ports differ from the single node's, so both can run.
#   stack/stack.sh node ACTION NAME           one cluster node: kill (SIGKILL), stop (SIGSTOP), cont
#       (SIGCONT), start (after a kill; waits healthy), pid. NAME: cassandra1-3, rabbitmq1-3.
#   stack/stack.sh cluster-env                the MAILQUEUE_* variables that point services at the clusters
#   stack/stack.sh env [ROLE]                 the MAILQUEUE_* variables of ROLE (default operator) on
#       the single node: backends over TLS, its own credential (roles: enqueue, dequeue, browse,
#       blob, webhook, sweep, schema, operator; stack/provision.py says what each may do)
#   stack/stack.sh rabbitmqctl --node N ARGS...   rabbitmqctl against cluster node N (1-3)
#
# Data and logs live under $MAILQUEUE_STACK_DIR (default: .stack/ in the project, git-ignored).
# Downloads and builds are cached per machine under $MAILQUEUE_CACHE_DIR (default ~/.cache/mailqueue-stack),
# so a fresh clone on the same machine does not rebuild MinIO or re-download Cassandra.
#
# This file holds the settings, the commands and what they share; each engine's steps are in
# stack/backends/ (cassandra.sh, rabbitmq.sh, minio.sh, and clusters.sh for --cluster), sourced below.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}"
CACHE_DIR="${MAILQUEUE_CACHE_DIR:-$HOME/.cache/mailqueue-stack}"
LOG_DIR="$STACK_DIR/logs"
PY="${MAILQUEUE_PYTHON:-$ROOT/.venv/bin/python}"

CASSANDRA_VERSION=5.0.9
CASSANDRA_PORT="${MAILQUEUE_CASSANDRA_PORT:-9042}"
CASSANDRA_STORAGE_PORT="${MAILQUEUE_CASSANDRA_STORAGE_PORT:-7000}"
# JMX on loopback only (what nodetool talks to: the benches flush the memtables between phases).
CASSANDRA_JMX_PORT="${MAILQUEUE_CASSANDRA_JMX_PORT:-7199}"
CASSANDRA_HEAP="${MAILQUEUE_CASSANDRA_HEAP:-1G}"
# AMQP over TLS only (5671, the amqps port); no plaintext listener.
RABBITMQ_PORT="${MAILQUEUE_RABBITMQ_PORT:-5671}"
RABBITMQ_DIST_PORT="${MAILQUEUE_RABBITMQ_DIST_PORT:-25672}"
RABBITMQ_NODE="${MAILQUEUE_RABBITMQ_NODE:-mailqueue@localhost}"
# MinIO has no semver tags on the module proxy: this pseudo-version is the pinned source revision.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
MINIO_PORT="${MAILQUEUE_MINIO_PORT:-9000}"
MINIO_CONSOLE_PORT="${MAILQUEUE_MINIO_CONSOLE_PORT:-9001}"
# `up --plaintext-loopback` adds, beside the TLS listeners, plaintext ones on loopback for the TLS
# benchmark's baseline (bench/tls_bench.py) and nothing else: RabbitMQ on 5672, Cassandra's
# client encryption made optional on its port, and a second MinIO (its own data) on 9002.
PLAINTEXT_LOOPBACK=0
RABBITMQ_PLAIN_PORT="${MAILQUEUE_RABBITMQ_PLAIN_PORT:-5672}"
MINIO_PLAIN_PORT="${MAILQUEUE_MINIO_PLAIN_PORT:-9002}"
MINIO_PLAIN_CONSOLE_PORT="${MAILQUEUE_MINIO_PLAIN_CONSOLE_PORT:-9003}"
# TLS and credentials (stack/pki.sh, stack/provision.py): made by `up`, once per .stack folder.
PKI_DIR="$STACK_DIR/pki"
CREDENTIALS_DIR="$STACK_DIR/credentials"
# The buckets of `make run` and of the Kubernetes tier, and the ones tests and benches make
# (mq-*): the roles' S3 policies name them.
S3_BUCKETS=(mailqueue-blobs mailqueue-kube-blobs "mq-*")

# The clusters (up --cluster): node i listens on 127.0.0.i (Cassandra) or port 570i (RabbitMQ).
CLUSTER_DIR="$STACK_DIR/cluster"
CLUSTER_CASSANDRA_PORT="${MAILQUEUE_CLUSTER_CASSANDRA_PORT:-9142}"
CLUSTER_CASSANDRA_STORAGE_PORT="${MAILQUEUE_CLUSTER_CASSANDRA_STORAGE_PORT:-7100}"
# Three JVMs on a 2-core, 24 GiB machine: 768 MB of heap each.
CLUSTER_CASSANDRA_HEAP="${MAILQUEUE_CLUSTER_CASSANDRA_HEAP:-768M}"
CLUSTER_RABBITMQ_BASE_PORT=5700
SPARK_MASTER_PORT="${MAILQUEUE_SPARK_MASTER_PORT:-7077}"
SPARK_UI_BASE_PORT=8090

CASSANDRA_LIB="$CACHE_DIR/cassandra-$CASSANDRA_VERSION/lib"
MINIO_BIN="$CACHE_DIR/minio-$MINIO_VERSION/minio"
RABBIT_BIN=/usr/lib/rabbitmq/bin

say() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# wait_for NAME SECONDS CHECK_FUNCTION LOG: poll CHECK until it succeeds or the deadline passes.
wait_for() {
  local name=$1 seconds=$2 check=$3 log=$4 start=$SECONDS
  while ! $check >/dev/null 2>&1; do
    if (( SECONDS - start > seconds )); then
      die "$name did not become healthy within ${seconds}s. Read $log, then run 'stack/stack.sh down' and 'stack/stack.sh up' again."
    fi
    if (( (SECONDS - start) % 10 == 0 )); then say "waiting for $name ($((SECONDS - start))s)"; fi
    sleep 1
  done
  say "$name healthy after $((SECONDS - start))s"
}

pid_of() { local f="$STACK_DIR/$1.pid"; [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"; }

for part in cassandra rabbitmq minio clusters; do
  # shellcheck source=/dev/null
  source "$ROOT/stack/backends/$part.sh"
done

# ---------------------------------------------------------------- commands
stop_pid() {
  local name=$1 pid; pid=$(pid_of "$name") || { rm -f "$STACK_DIR/$name.pid"; return 0; }
  say "$name: stopping PID $pid"
  kill "$pid" 2>/dev/null || true
  local start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    (( SECONDS - start > 30 )) && { kill -9 "$pid" 2>/dev/null || true; break; }
    sleep 0.5
  done
  rm -f "$STACK_DIR/$name.pid"
}

# The local CA, the certificates and one credential per role (each made once, kept in .stack/).
secure_files() {
  # openssl for the local CA; curl for the health checks of MinIO (and of the clusters' Spark)
  local tool
  for tool in openssl curl; do
    command -v "$tool" >/dev/null && continue
    say "$tool: installing from Debian (apt-get)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$tool"; } >"$LOG_DIR/$tool-install.log" 2>&1 \
      || die "$tool: apt-get install $tool failed; see $LOG_DIR/$tool-install.log (needs root)"
  done
  "$ROOT/stack/pki.sh" "$PKI_DIR"
  "$PY" "$ROOT/stack/provision.py" credentials "$CREDENTIALS_DIR"
}

# plaintext_listeners_missing: which running backend lacks its plaintext listener (a node started
# by a plain `up`: its configuration is read at start only).
plaintext_listeners_missing() {
  if rabbit_healthy >/dev/null 2>&1 && ! grep -q "^listeners.tcp.1" "$STACK_DIR/rabbitmq/rabbitmq.conf" 2>/dev/null; then echo rabbitmq; fi
  if cassandra_healthy >/dev/null 2>&1 && ! grep -q "optional: true" "$STACK_DIR/cassandra/cassandra.yaml" 2>/dev/null; then echo cassandra; fi
}

# provision_backends CASSANDRA_ADDRESS [REPLICATION]: roles, users and policies on the running
# backends (idempotent), the bucket, and the schema of `make run`'s keyspace.
provision_backends() {
  "$PY" "$ROOT/stack/provision.py" cassandra "$CREDENTIALS_DIR" "$1" "$PKI_DIR/ca.crt" --replication "${2:-1}"
  if [[ ${2:-1} == 1 ]]; then ( rabbit_env; rabbit_users "$RABBIT_BIN/rabbitmqctl" -q ); else ( rabbit_env_node 1; rabbit_users "$RABBIT_BIN/rabbitmqctl" -q ); fi
  "$PY" "$ROOT/stack/provision.py" minio "$CREDENTIALS_DIR" "127.0.0.1:$MINIO_PORT" "$PKI_DIR/ca.crt" "${S3_BUCKETS[@]}"
}

# one_up_at_a_time: one `up` at a time (a test session and an operator, say). A second Cassandra
# launched on the data directory of one still starting fails on its files and leaves its PID in
# cassandra.pid. The second `up` waits, then finds every backend healthy and starts nothing. A lock
# directory holding the PID, not flock: the servers started would inherit a flock's descriptor and
# hold it for their whole life; a holder killed with SIGKILL leaves a PID that is gone, taken over.
one_up_at_a_time() {
  local lock="$STACK_DIR/up.lock.d" holder waited=0
  while ! mkdir "$lock" 2>/dev/null; do
    holder=$(cat "$lock/pid" 2>/dev/null) || holder=""
    if [[ -n $holder ]] && ! kill -0 "$holder" 2>/dev/null; then rm -rf "$lock"; continue; fi
    (( waited % 30 == 0 )) && say "waiting for another 'stack/stack.sh up' (PID ${holder:-starting}) to finish"
    (( waited++ < 900 )) || die "another 'stack/stack.sh up' (PID $holder) has run for 15 minutes: is it stuck? (ps $holder; remove $lock once it is gone)"
    sleep 1
  done
  echo $$ >"$lock/pid"
  trap 'rm -rf "$STACK_DIR/up.lock.d"' EXIT
}

up() {
  [[ -x $PY ]] || die "no Python environment at $PY: run 'make install' first"
  mkdir -p "$STACK_DIR" "$LOG_DIR"
  one_up_at_a_time
  # Installs first (each is skipped once done), then start whatever is not healthy.
  rabbit_install
  cassandra_install
  minio_install
  secure_files
  if [[ $PLAINTEXT_LOOPBACK == 1 ]]; then
    local missing; missing=$(plaintext_listeners_missing)
    [[ -z $missing ]] || die "$(echo $missing) already running without the plaintext listener: stack/stack.sh down, then up --plaintext-loopback"
  fi
  minio_healthy >/dev/null 2>&1 || minio_start
  rabbit_healthy >/dev/null 2>&1 || rabbit_ensure
  cassandra_healthy >/dev/null 2>&1 || cassandra_start
  provision_backends "127.0.0.1:$CASSANDRA_PORT"
  if [[ $PLAINTEXT_LOOPBACK == 1 ]]; then minio_plain_healthy >/dev/null 2>&1 || minio_plain_start; fi
  ( set -a; eval "$(env_of schema)"; "$PY" -m services.runtime.migrate ) >>"$LOG_DIR/schema.log" 2>&1 \
    || die "schema step failed: see $LOG_DIR/schema.log"
  say "TLS on every backend, one credential per service (docs/pages/deploying/security.md); operator variables: stack/stack.sh env"
  status
}

# env_of ROLE: the MAILQUEUE_* variables that point a component (or the operator) at the single
# node stack with its own credential, over TLS. `make run`, the tests and the benches use them.
env_of() {
  cat <<EOF
MAILQUEUE_CREDENTIALS_DIR=$CREDENTIALS_DIR/$1
MAILQUEUE_CASSANDRA_HOSTS=127.0.0.1
MAILQUEUE_CASSANDRA_PORT=$CASSANDRA_PORT
MAILQUEUE_CASSANDRA_CA_FILE=$PKI_DIR/ca.crt
MAILQUEUE_RABBITMQ_URL=amqps://127.0.0.1:$RABBITMQ_PORT/%2F
MAILQUEUE_RABBITMQ_CA_FILE=$PKI_DIR/ca.crt
MAILQUEUE_S3_ENDPOINT=127.0.0.1:$MINIO_PORT
MAILQUEUE_S3_CA_FILE=$PKI_DIR/ca.crt
MAILQUEUE_TLS_CA_FILE=$PKI_DIR/ca.crt
EOF
}

# env_plain ROLE: the same, through the plaintext listeners of up --plaintext-loopback (no CA).
env_plain() {
  cat <<EOF
MAILQUEUE_CREDENTIALS_DIR=$CREDENTIALS_DIR/$1
MAILQUEUE_CASSANDRA_HOSTS=127.0.0.1
MAILQUEUE_CASSANDRA_PORT=$CASSANDRA_PORT
MAILQUEUE_RABBITMQ_URL=amqp://127.0.0.1:$RABBITMQ_PLAIN_PORT/%2F
MAILQUEUE_S3_ENDPOINT=127.0.0.1:$MINIO_PLAIN_PORT
EOF
}

down() {
  rabbit_stop
  stop_pid cassandra
  stop_pid minio
  stop_pid minio-plain
  local start=$SECONDS
  while pid_of rabbitmq >/dev/null && (( SECONDS - start < 30 )); do sleep 0.5; done
  rm -f "$STACK_DIR/rabbitmq.pid"
  say "stack stopped (data kept in $STACK_DIR; remove it for a clean slate)"
}

status() {
  local rc=0 line
  printf '%-10s %-16s %-8s %-8s %s\n' COMPONENT ADDRESS PID MEM_MB HEALTH
  for line in "cassandra:$CASSANDRA_PORT:cassandra_healthy" "rabbitmq:$RABBITMQ_PORT:rabbit_healthy" "minio:$MINIO_PORT:minio_healthy"; do
    IFS=: read -r name port check <<<"$line"
    local pid mem=- health=healthy
    pid=$(pid_of "$name") || pid=-
    [[ $pid != - ]] && mem=$(( $(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0) / 1024 ))
    $check >/dev/null 2>&1 || { health=DOWN; rc=1; }
    printf '%-10s %-16s %-8s %-8s %s\n' "$name" "127.0.0.1:$port" "$pid" "$mem" "$health"
  done
  return $rc
}

case "${1:-} ${2:-}" in
  "up --cluster") cluster_up ;;
  "up --plaintext-loopback") PLAINTEXT_LOOPBACK=1; up ;;
  "down --cluster") cluster_down ;;
  "status --cluster") cluster_status ;;
  "up "*) up ;;
  "down "*) down ;;
  "status "*) status ;;
  "node "*) shift; node "$@" ;;
  "cluster-env "*) cluster_env ;;
  "env --plaintext-loopback") env_plain "${3:-operator}" ;;
  "env "*) env_of "${2:-operator}" ;;
  "rabbitmqctl --node") shift 2; i=$1; shift; rabbit_env_node "$i"; exec "$RABBIT_BIN/rabbitmqctl" "$@" ;;
  "rabbitmqctl "*) shift; rabbit_env; exec "$RABBIT_BIN/rabbitmqctl" "$@" ;;
  "nodetool "*) shift; cassandra_nodetool "$@" ;;
  *) echo "usage: $0 up|down|status [--cluster] | up --plaintext-loopback | env [--plaintext-loopback] [ROLE] | node kill|stop|cont|start|pid NAME | cluster-env | env [ROLE] | rabbitmqctl [--node N] ARGS... | nodetool ARGS..." >&2; exit 2 ;;
esac
