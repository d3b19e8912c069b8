#!/usr/bin/env bash
# The local stack: real Cassandra, RabbitMQ and MinIO on loopback, no containers.
#
#   stack/stack.sh up        install what is missing (once per machine), start what is down, wait healthy
#   stack/stack.sh down      stop everything this script started
#   stack/stack.sh status    one line per component: port, PID, healthy or not (exit 1 if any is down)
#   stack/stack.sh rabbitmqctl ARGS...   run rabbitmqctl against the local node
#
# Data and logs live under $MAILQUEUE_STACK_DIR (default: .stack/ in the project, git-ignored).
# Downloads and builds are cached per machine under $MAILQUEUE_CACHE_DIR (default ~/.cache/mailqueue-stack),
# so a fresh clone on the same machine does not rebuild MinIO or re-download Cassandra.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}"
CACHE_DIR="${MAILQUEUE_CACHE_DIR:-$HOME/.cache/mailqueue-stack}"
LOG_DIR="$STACK_DIR/logs"
PY="${MAILQUEUE_PYTHON:-$ROOT/.venv/bin/python}"

CASSANDRA_VERSION=5.0.9
CASSANDRA_PORT="${MAILQUEUE_CASSANDRA_PORT:-9042}"
CASSANDRA_STORAGE_PORT="${MAILQUEUE_CASSANDRA_STORAGE_PORT:-7000}"
CASSANDRA_HEAP="${MAILQUEUE_CASSANDRA_HEAP:-1G}"
RABBITMQ_PORT="${MAILQUEUE_RABBITMQ_PORT:-5672}"
RABBITMQ_DIST_PORT="${MAILQUEUE_RABBITMQ_DIST_PORT:-25672}"
RABBITMQ_NODE="${MAILQUEUE_RABBITMQ_NODE:-mailqueue@localhost}"
# MinIO has no semver tags on the module proxy: this pseudo-version is the pinned source revision.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
MINIO_PORT="${MAILQUEUE_MINIO_PORT:-9000}"
MINIO_CONSOLE_PORT="${MAILQUEUE_MINIO_CONSOLE_PORT:-9001}"
export MINIO_ROOT_USER="${MAILQUEUE_S3_ACCESS_KEY:-minioadmin}"
export MINIO_ROOT_PASSWORD="${MAILQUEUE_S3_SECRET_KEY:-minioadmin}"

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

# ---------------------------------------------------------------- Cassandra
cassandra_healthy() {
  "$PY" - "$CASSANDRA_PORT" <<'EOF'
import sys
from cassandra.cluster import Cluster
c = Cluster(["127.0.0.1"], port=int(sys.argv[1]), connect_timeout=2, protocol_version=5)
s = c.connect()
print(s.execute("SELECT release_version FROM system.local").one()[0])
c.shutdown()
EOF
}

cassandra_install() {
  [[ -f "$CASSANDRA_LIB/cassandra-all-$CASSANDRA_VERSION.jar" ]] && return
  command -v mvn >/dev/null || die "cassandra: Maven (mvn) is needed to fetch Cassandra from Maven Central: apt-get install maven"
  say "cassandra: fetching cassandra-all $CASSANDRA_VERSION and its dependencies from Maven Central (about 100 jars, once per machine)"
  mkdir -p "$LOG_DIR"
  if ! mvn -B -f "$ROOT/stack/cassandra/pom.xml" -Dcassandra.version="$CASSANDRA_VERSION" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$CASSANDRA_LIB" \
      >"$LOG_DIR/cassandra-install.log" 2>&1; then
    die "cassandra: Maven download failed; see $LOG_DIR/cassandra-install.log"
  fi
}

java17() {
  local j
  for j in "${MAILQUEUE_JAVA:-}" /usr/lib/jvm/java-17-openjdk-amd64/bin/java /usr/lib/jvm/java-17-openjdk/bin/java "$(command -v java || true)"; do
    [[ -n $j && -x $j ]] && { echo "$j"; return; }
  done
  die "cassandra: no JDK 17 found: apt-get install openjdk-17-jdk-headless"
}

cassandra_start() {
  local dir="$STACK_DIR/cassandra" log="$LOG_DIR/cassandra.log"
  mkdir -p "$dir" "$LOG_DIR"
  sed -e "s#@DIR@#$dir#g" -e "s#@PORT@#$CASSANDRA_PORT#g" -e "s#@STORAGE_PORT@#$CASSANDRA_STORAGE_PORT#g" \
    "$ROOT/stack/cassandra/cassandra.yaml.in" >"$dir/cassandra.yaml"
  local jamm
  jamm=$(ls "$CASSANDRA_LIB"/jamm-*.jar | head -1)
  # JPMS flags: Cassandra 5.0's conf/jvm17-server.options.
  local opens=(
    -Djdk.attach.allowAttachSelf=true
    --add-exports java.base/jdk.internal.misc=ALL-UNNAMED
    --add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED
    --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED
    --add-exports java.rmi/sun.rmi.server=ALL-UNNAMED
    --add-exports java.sql/java.sql=ALL-UNNAMED
    --add-exports java.base/java.lang.ref=ALL-UNNAMED
    --add-exports jdk.unsupported/sun.misc=ALL-UNNAMED
    --add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
    --add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED
    --add-opens java.base/java.lang.module=ALL-UNNAMED
    --add-opens java.base/jdk.internal.loader=ALL-UNNAMED
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
    --add-opens java.base/jdk.internal.reflect=ALL-UNNAMED
    --add-opens java.base/jdk.internal.math=ALL-UNNAMED
    --add-opens java.base/jdk.internal.module=ALL-UNNAMED
    --add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED
    --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED
    --add-opens java.base/java.io=ALL-UNNAMED
    --add-opens java.base/java.lang.reflect=ALL-UNNAMED
    --add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
    --add-opens java.base/java.lang=ALL-UNNAMED
    --add-opens java.base/java.util=ALL-UNNAMED
  )
  say "cassandra: starting on 127.0.0.1:$CASSANDRA_PORT (heap $CASSANDRA_HEAP, log $log)"
  nohup "$(java17)" -Xms"$CASSANDRA_HEAP" -Xmx"$CASSANDRA_HEAP" -XX:+UseG1GC -XX:+ParallelRefProcEnabled \
    -Xss256k -XX:+HeapDumpOnOutOfMemoryError -XX:HeapDumpPath="$dir" \
    "${opens[@]}" \
    -Dio.netty.tryReflectionSetAccessible=true \
    -javaagent:"$jamm" \
    -Dcassandra.config="file://$dir/cassandra.yaml" \
    -Dcassandra-foreground=yes \
    -Dcassandra.storagedir="$dir" \
    -Dcassandra.logdir="$LOG_DIR" \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=0 \
    -Dlogback.configurationFile="file://$ROOT/stack/cassandra/logback.xml" \
    -Dmailqueue.cassandra.log="$log" \
    -cp "$CASSANDRA_LIB/*" org.apache.cassandra.service.CassandraDaemon \
    >"$LOG_DIR/cassandra.out" 2>&1 &
  echo $! >"$STACK_DIR/cassandra.pid"
  wait_for cassandra 180 cassandra_healthy "$log (and $LOG_DIR/cassandra.out)"
}

# ---------------------------------------------------------------- RabbitMQ
rabbit_env() {
  # The Erlang cookie lives with the machine's cache, so every checkout on this machine can talk
  # to the one local node (its data stays in this checkout's .stack/).
  export HOME="$CACHE_DIR/rabbitmq-home"
  mkdir -p "$HOME"
  export RABBITMQ_NODENAME="$RABBITMQ_NODE"
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT="$RABBITMQ_PORT"
  export RABBITMQ_DIST_PORT="$RABBITMQ_DIST_PORT"
  export RABBITMQ_MNESIA_BASE="$STACK_DIR/rabbitmq/mnesia"
  export RABBITMQ_LOG_BASE="$LOG_DIR/rabbitmq"
  export RABBITMQ_PID_FILE="$STACK_DIR/rabbitmq.pid"
  export RABBITMQ_CONFIG_FILE="$STACK_DIR/rabbitmq/rabbitmq"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$STACK_DIR/rabbitmq/advanced.config"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$STACK_DIR/rabbitmq/enabled_plugins"
  export ERL_EPMD_ADDRESS=127.0.0.1
  # Erlang distribution (the node's $RABBITMQ_DIST_PORT and the CLI tools' own nodes) on loopback too.
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

rabbit_healthy() { ( rabbit_env; "$RABBIT_BIN/rabbitmq-diagnostics" -q ping ); }

rabbit_install() {
  [[ -x "$RABBIT_BIN/rabbitmq-server" ]] && return
  say "rabbitmq: installing rabbitmq-server from Debian (apt-get, about 20 s)"
  mkdir -p "$LOG_DIR"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; } \
      >"$LOG_DIR/rabbitmq-install.log" 2>&1; then
    die "rabbitmq: apt-get install rabbitmq-server failed; see $LOG_DIR/rabbitmq-install.log (needs root)"
  fi
  # The package starts its own system service where it can; ours runs on its own data folder.
  service rabbitmq-server stop >/dev/null 2>&1 || true
}

rabbit_start() {
  mkdir -p "$STACK_DIR/rabbitmq/mnesia" "$LOG_DIR/rabbitmq"
  printf '[].\n' >"$STACK_DIR/rabbitmq/enabled_plugins"
  cat >"$STACK_DIR/rabbitmq/rabbitmq.conf" <<EOF
loopback_users.guest = true
listeners.tcp.1 = 127.0.0.1:$RABBITMQ_PORT
# A small machine: never block publishers for a nearly full disk of a dev box.
disk_free_limit.absolute = 256MB
vm_memory_high_watermark.relative = 0.2
EOF
  # The delay ladder's wait queues dead-letter at-least-once: a message that a hop was forwarding
  # when the broker stopped is sent again once this timeout passes unconfirmed (default 180 s,
  # which would make a mail up to 3 minutes late after a broker restart).
  cat >"$STACK_DIR/rabbitmq/advanced.config" <<EOF
[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].
EOF
  say "rabbitmq: starting node $RABBITMQ_NODE on 127.0.0.1:$RABBITMQ_PORT (logs $LOG_DIR/rabbitmq/)"
  ( rabbit_env; "$RABBIT_BIN/rabbitmq-server" -detached ) >"$LOG_DIR/rabbitmq.out" 2>&1 \
    || die "rabbitmq: start failed; see $LOG_DIR/rabbitmq.out"
  wait_for rabbitmq 120 rabbit_healthy "$LOG_DIR/rabbitmq/"
}

rabbit_stop() {
  local pid; pid=$(pid_of rabbitmq) || return 0
  ( rabbit_env; "$RABBIT_BIN/rabbitmqctl" -q stop >/dev/null 2>&1 ) || kill "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- MinIO
minio_healthy() { curl -fsS -m 2 "http://127.0.0.1:$MINIO_PORT/minio/health/live"; }

minio_install() {
  [[ -x $MINIO_BIN ]] && return
  command -v go >/dev/null || die "minio: Go >= 1.24 is needed to build MinIO (go install)"
  say "minio: building github.com/minio/minio@$MINIO_VERSION with go install (several minutes, once per machine; log $LOG_DIR/minio-build.log)"
  mkdir -p "$LOG_DIR" "$(dirname "$MINIO_BIN")"
  ( GOBIN="$(dirname "$MINIO_BIN")" go install -v "github.com/minio/minio@$MINIO_VERSION" 2>&1 \
      | tee "$LOG_DIR/minio-build.log" | awk '{ n++; if (n % 200 == 0) { printf "[stack] minio: %d packages compiled\n", n > "/dev/stderr" } }' )
  [[ -x $MINIO_BIN ]] || die "minio: build failed; see $LOG_DIR/minio-build.log"
}

minio_start() {
  mkdir -p "$STACK_DIR/minio/data" "$LOG_DIR"
  say "minio: starting on 127.0.0.1:$MINIO_PORT (log $LOG_DIR/minio.log)"
  MINIO_BROWSER=off nohup "$MINIO_BIN" server "$STACK_DIR/minio/data" --quiet \
    --address "127.0.0.1:$MINIO_PORT" --console-address "127.0.0.1:$MINIO_CONSOLE_PORT" \
    >"$LOG_DIR/minio.log" 2>&1 &
  echo $! >"$STACK_DIR/minio.pid"
  wait_for minio 60 minio_healthy "$LOG_DIR/minio.log"
}

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

up() {
  [[ -x $PY ]] || die "no Python environment at $PY: run 'make install' first"
  mkdir -p "$STACK_DIR" "$LOG_DIR"
  # Installs first (each is skipped once done), then start whatever is not healthy.
  rabbit_install
  cassandra_install
  minio_install
  minio_healthy >/dev/null 2>&1 || minio_start
  rabbit_healthy >/dev/null 2>&1 || rabbit_start
  cassandra_healthy >/dev/null 2>&1 || cassandra_start
  status
}

down() {
  rabbit_stop
  stop_pid cassandra
  stop_pid minio
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

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  rabbitmqctl) shift; rabbit_env; exec "$RABBIT_BIN/rabbitmqctl" "$@" ;;
  *) echo "usage: $0 up|down|status|rabbitmqctl ARGS..." >&2; exit 2 ;;
esac
