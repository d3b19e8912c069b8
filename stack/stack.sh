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
#       blob, sweep, schema, operator; stack/provision.py says what each may do)
#   stack/stack.sh rabbitmqctl --node N ARGS...   rabbitmqctl against cluster node N (1-3)
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

# ---------------------------------------------------------------- Cassandra
# cassandra_answers ADDRESS PORT: the node at ADDRESS answers CQL itself (no other node answers for it).
# Over TLS, as the operator role (or, before provisioning, the default superuser a new node makes).
cassandra_answers() {
  "$PY" "$ROOT/stack/provision.py" cassandra-ping "$CREDENTIALS_DIR" "$1:$2" "$PKI_DIR/ca.crt"
}

cassandra_healthy() { cassandra_answers 127.0.0.1 "$CASSANDRA_PORT"; }

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

# cassandra_launch NAME ADDRESS PORT STORAGE_PORT HEAP CLUSTER SEEDS AUTO_BOOTSTRAP: start one node in
# the background (data in $STACK_DIR/NAME, PID in $STACK_DIR/NAME.pid); the caller waits for it.
cassandra_launch() {
  local name=$1 address=$2 port=$3 storage_port=$4 heap=$5 cluster=$6 seeds=$7 auto_bootstrap=$8
  local dir="$STACK_DIR/$name" log="$LOG_DIR/$name.log"
  mkdir -p "$dir" "$(dirname "$log")"
  sed -e "s#@DIR@#$dir#g" -e "s#@PORT@#$port#g" -e "s#@STORAGE_PORT@#$storage_port#g" -e "s#@ADDRESS@#$address#g" \
    -e "s#@CLUSTER@#$cluster#g" -e "s#@SEEDS@#$seeds#g" -e "s#@AUTO_BOOTSTRAP@#$auto_bootstrap#g" \
    -e "s#@KEYSTORE@#$PKI_DIR/backends.pem#g" -e "s#@OPTIONAL@#${CASSANDRA_ENCRYPTION_OPTIONAL:-false}#g" \
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
  say "$name: starting on $address:$port (heap $heap, log $log)"
  nohup "$(java17)" -Xms"$heap" -Xmx"$heap" -XX:+UseG1GC -XX:+ParallelRefProcEnabled \
    -Xss256k -XX:+HeapDumpOnOutOfMemoryError -XX:HeapDumpPath="$dir" \
    "${opens[@]}" \
    -Dio.netty.tryReflectionSetAccessible=true \
    -javaagent:"$jamm" \
    -Dcassandra.config="file://$dir/cassandra.yaml" \
    -Dcassandra-foreground=yes \
    -Dcassandra.storagedir="$dir" \
    -Dcassandra.logdir="$(dirname "$log")" \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms="${CASSANDRA_RING_DELAY_MS:-0}" \
    -Dcassandra.consistent.rangemovement=false \
    -Dcassandra.superuser_setup_delay_ms=0 \
    -Dlogback.configurationFile="file://$ROOT/stack/cassandra/logback.xml" \
    -Dmailqueue.cassandra.log="$log" \
    -cp "$CASSANDRA_LIB/*" org.apache.cassandra.service.CassandraDaemon \
    >"${log%.log}.out" 2>&1 &
  echo $! >"$STACK_DIR/$name.pid"
}

cassandra_start() {
  [[ $PLAINTEXT_LOOPBACK == 1 ]] && CASSANDRA_ENCRYPTION_OPTIONAL=true
  cassandra_launch cassandra 127.0.0.1 "$CASSANDRA_PORT" "$CASSANDRA_STORAGE_PORT" "$CASSANDRA_HEAP" mailqueue-local \
    "127.0.0.1:$CASSANDRA_STORAGE_PORT" true
  wait_for cassandra 180 cassandra_healthy "$LOG_DIR/cassandra.log (and $LOG_DIR/cassandra.out)"
}

# ---------------------------------------------------------------- RabbitMQ
# rabbit_env [NODE PORT DIST_PORT DATA_DIR LOG_DIR]: the environment of one RabbitMQ node (default:
# the single node). The Erlang cookie lives with the machine's cache, so every checkout on this
# machine can talk to the local nodes (their data stays in this checkout's .stack/).
rabbit_env() {
  local node=${1:-$RABBITMQ_NODE} port=${2:-$RABBITMQ_PORT} dist=${3:-$RABBITMQ_DIST_PORT}
  local dir=${4:-$STACK_DIR/rabbitmq} logs=${5:-$LOG_DIR/rabbitmq}
  export HOME="$CACHE_DIR/rabbitmq-home"
  mkdir -p "$HOME"
  export RABBITMQ_NODENAME="$node"
  # Listeners come from rabbitmq.conf (TLS only): these would add a plaintext one.
  unset RABBITMQ_NODE_IP_ADDRESS RABBITMQ_NODE_PORT
  : "$port"
  export RABBITMQ_DIST_PORT="$dist"
  export RABBITMQ_MNESIA_BASE="$dir/mnesia"
  export RABBITMQ_LOG_BASE="$logs"
  export RABBITMQ_PID_FILE="$dir.pid"
  export RABBITMQ_CONFIG_FILE="$dir/rabbitmq"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
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

# rabbit_tls PORT [PLAIN_PORT]: the node's listener, TLS only, with the backends' certificate
# (PLAIN_PORT: and a plaintext one on loopback, for up --plaintext-loopback).
rabbit_tls() {
  cat <<EOF
loopback_users = none
$(if [[ -n ${2:-} ]]; then echo "listeners.tcp.1 = 127.0.0.1:$2"; else echo "listeners.tcp = none"; fi)
listeners.ssl.default = 127.0.0.1:$1
ssl_options.cacertfile = $PKI_DIR/ca.crt
ssl_options.certfile = $PKI_DIR/backends.crt
ssl_options.keyfile = $PKI_DIR/backends.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2
EOF
}

# rabbit_users CTL...: one user per role (stack/provision.py says which permissions), passwords
# read by the node from their files (never on a command line); guest is deleted.
rabbit_users() {
  local role user configure write read tags file
  "$@" await_startup </dev/null >/dev/null
  while IFS=$'\t' read -r role user configure write read tags; do
    file="$CREDENTIALS_DIR/$role/rabbitmq-password"
    "$@" eval "{ok, P} = file:read_file(\"$file\"), U = <<\"$user\">>, W = string:trim(P),
      case rabbit_auth_backend_internal:lookup_user(U) of
        {ok, _} -> rabbit_auth_backend_internal:change_password(U, W, <<\"stack\">>);
        _ -> rabbit_auth_backend_internal:add_user(U, W, <<\"stack\">>) end." </dev/null >/dev/null
    "$@" set_permissions -p / "$user" "$configure" "$write" "$read" </dev/null >/dev/null
    "$@" set_user_tags "$user" $tags </dev/null >/dev/null
  done < <("$PY" "$ROOT/stack/provision.py" rabbitmq-users "$CREDENTIALS_DIR")
  "$@" delete_user guest >/dev/null 2>&1 || true
}

rabbit_start() {
  mkdir -p "$STACK_DIR/rabbitmq/mnesia" "$LOG_DIR/rabbitmq"
  printf '[].\n' >"$STACK_DIR/rabbitmq/enabled_plugins"
  cat >"$STACK_DIR/rabbitmq/rabbitmq.conf" <<EOF
$(rabbit_tls "$RABBITMQ_PORT" "$([[ $PLAINTEXT_LOOPBACK == 1 ]] && echo "$RABBITMQ_PLAIN_PORT")")
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
minio_healthy() { curl -fsS -m 2 --cacert "$PKI_DIR/ca.crt" "https://127.0.0.1:$MINIO_PORT/minio/health/live"; }
minio_plain_healthy() { curl -fsS -m 2 "http://127.0.0.1:$MINIO_PLAIN_PORT/minio/health/live"; }

minio_install() {
  [[ -x $MINIO_BIN ]] && return
  command -v go >/dev/null || die "minio: Go >= 1.24 is needed to build MinIO (go install)"
  say "minio: building github.com/minio/minio@$MINIO_VERSION with go install (several minutes, once per machine; log $LOG_DIR/minio-build.log)"
  mkdir -p "$LOG_DIR" "$(dirname "$MINIO_BIN")"
  ( GOBIN="$(dirname "$MINIO_BIN")" go install -v "github.com/minio/minio@$MINIO_VERSION" 2>&1 \
      | tee "$LOG_DIR/minio-build.log" | awk '{ n++; if (n % 200 == 0) { printf "[stack] minio: %d packages compiled\n", n > "/dev/stderr" } }' )
  [[ -x $MINIO_BIN ]] || die "minio: build failed; see $LOG_DIR/minio-build.log"
}

# minio_launch NAME PORT CONSOLE_PORT: a MinIO server with its own data in $STACK_DIR/NAME, root
# credentials from the operator's files. It serves TLS when NAME/certs holds a certificate.
minio_launch() {
  local name=$1 port=$2 console=$3
  MINIO_ROOT_USER="$(cat "$CREDENTIALS_DIR/operator/s3-access-key")" \
  MINIO_ROOT_PASSWORD="$(cat "$CREDENTIALS_DIR/operator/s3-secret-key")" \
  MINIO_BROWSER=off nohup "$MINIO_BIN" server "$STACK_DIR/$name/data" --quiet --certs-dir "$STACK_DIR/$name/certs" \
    --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
    >"$LOG_DIR/$name.log" 2>&1 &
  echo $! >"$STACK_DIR/$name.pid"
}

minio_start() {
  mkdir -p "$STACK_DIR/minio/data" "$STACK_DIR/minio/certs" "$LOG_DIR"
  # MinIO serves TLS from certs/public.crt and private.key, and reloads them when they change.
  ln -sf "$PKI_DIR/backends.crt" "$STACK_DIR/minio/certs/public.crt"
  ln -sf "$PKI_DIR/backends.key" "$STACK_DIR/minio/certs/private.key"
  say "minio: starting on https://127.0.0.1:$MINIO_PORT (log $LOG_DIR/minio.log)"
  minio_launch minio "$MINIO_PORT" "$MINIO_CONSOLE_PORT"
  wait_for minio 60 minio_healthy "$LOG_DIR/minio.log"
}

# ---------------------------------------------------------------- the clusters (up --cluster)
cluster_cassandra_address() { echo "127.0.0.$1"; }

cluster_cassandra_healthy() { cassandra_answers "$(cluster_cassandra_address "$1")" "$CLUSTER_CASSANDRA_PORT"; }

# Every node answers, and node 1 sees the three nodes UN (up, normal) in its ring.
cluster_cassandra_ring() {
  "$PY" "$ROOT/stack/provision.py" cassandra-ring "$CREDENTIALS_DIR" 127.0.0.1,127.0.0.2,127.0.0.3 "$CLUSTER_CASSANDRA_PORT" \
    "$PKI_DIR/ca.crt"
}

cluster_cassandra_launch() {
  local i=$1 bootstrap=true
  # A new cluster has nothing to stream: nodes 2 and 3 join without bootstrapping, together.
  [[ -d "$CLUSTER_DIR/cassandra$i/data" ]] || bootstrap=false
  # Nodes 2 and 3 wait up to 30 s for the seed's first gossip answer (the ring delay bounds that
  # shadow round; at 0 a joining node gave up after 2 s on a busy machine: "Unable to gossip with
  # any peers"); it returns as soon as the seed answers.
  [[ $i != 1 ]] && local CASSANDRA_RING_DELAY_MS=30000
  cassandra_launch "cluster/cassandra$i" "$(cluster_cassandra_address "$i")" "$CLUSTER_CASSANDRA_PORT" \
    "$CLUSTER_CASSANDRA_STORAGE_PORT" "$CLUSTER_CASSANDRA_HEAP" mailqueue-cluster "127.0.0.1:$CLUSTER_CASSANDRA_STORAGE_PORT" \
    "$([[ $i == 1 ]] && echo true || echo "$bootstrap")"
}

# cluster_cassandra_wait_ring SECONDS: wait until node 1 sees the three nodes up, saying which are
# up every 20 s. A node whose process exited meanwhile is shown (its last lines) and started again,
# twice at most; at the deadline, every node's last errors are shown before giving up.
cluster_cassandra_wait_ring() {
  local seconds=$1 start=$SECONDS line i relaunched=""
  until line=$(cluster_cassandra_ring 2>/dev/null); do
    for i in 2 3; do
      pid_of "cluster/cassandra$i" >/dev/null && continue
      [[ $relaunched == *$i$i* ]] && die "cluster/cassandra$i exited three times; read $LOG_DIR/cluster/cassandra$i.log and .out"
      say "cluster/cassandra$i exited while joining; its last lines:"
      tail -n 15 "$LOG_DIR/cluster/cassandra$i.out" "$LOG_DIR/cluster/cassandra$i.log" >&2 2>/dev/null || true
      relaunched+=$i
      cluster_cassandra_launch "$i"
    done
    if (( SECONDS - start > seconds )); then
      for i in 1 2 3; do
        say "cluster/cassandra$i (pid $(pid_of "cluster/cassandra$i" || echo none)): its last warnings and errors:"
        grep -E " (WARN|ERROR) " "$LOG_DIR/cluster/cassandra$i.log" 2>/dev/null | tail -n 8 | cut -c1-300 >&2 || true
      done
      die "cassandra ring (3 nodes up) not formed within ${seconds}s (nodes up: ${line:-none}). Read $LOG_DIR/cluster/cassandra*.log, then run 'stack/stack.sh down --cluster' and 'stack/stack.sh up --cluster' again."
    fi
    (( (SECONDS - start) % 20 < 5 )) && say "waiting for cassandra ring (3 nodes up) ($((SECONDS - start))s; up: ${line:-none})"
    sleep 2
  done
  say "cassandra ring (3 nodes up) after $((SECONDS - start))s: $line"
}

cluster_rabbit_node() { echo "mq$1@localhost"; }
cluster_rabbit_port() { echo $((CLUSTER_RABBITMQ_BASE_PORT + $1)); }

# rabbit_env_node N: the environment of cluster node N (its own data, logs, ports and config).
rabbit_env_node() {
  rabbit_env "$(cluster_rabbit_node "$1")" "$(cluster_rabbit_port "$1")" $((25700 + $1)) "$CLUSTER_DIR/rabbitmq$1" \
    "$LOG_DIR/cluster/rabbitmq$1"
  # A hung node is declared down after 10 s instead of 60 s: until then every cluster-wide change
  # (a queue or binding declared) waits for it (measured: tests/cluster/test_faults.py).
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="$RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS -kernel net_ticktime 10"
  export RABBITMQ_CTL_ERL_ARGS="$RABBITMQ_CTL_ERL_ARGS -kernel net_ticktime 10"
}

cluster_rabbit_healthy() { ( rabbit_env_node "$1"; "$RABBIT_BIN/rabbitmq-diagnostics" -q -t 5 check_running ); }

# The three nodes are running members of one cluster, as node 1 sees it.
cluster_rabbit_formed() {
  local running
  running=$( rabbit_env_node 1; "$RABBIT_BIN/rabbitmqctl" -q -t 10 cluster_status --formatter json ) || return 1
  "$PY" -c 'import json,sys; n=json.loads(sys.argv[1])["running_nodes"]; print(" ".join(sorted(n))); sys.exit(len(n) != 3)' "$running"
}

cluster_rabbit_launch() {
  local i=$1 dir="$CLUSTER_DIR/rabbitmq$1"
  mkdir -p "$dir/mnesia" "$LOG_DIR/cluster/rabbitmq$i"
  printf '[].\n' >"$dir/enabled_plugins"
  # classic_config peer discovery: a blank node joins the nodes listed (node 1 is started first).
  cat >"$dir/rabbitmq.conf" <<EOF
$(rabbit_tls "$(cluster_rabbit_port "$i")")
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = $(cluster_rabbit_node 1)
cluster_formation.classic_config.nodes.2 = $(cluster_rabbit_node 2)
cluster_formation.classic_config.nodes.3 = $(cluster_rabbit_node 3)
# A node that was cut off (hung, partitioned) and comes back is restarted by the winning side, so
# the cluster heals by itself (pause_minority left a paused node partitioned for good: measured).
cluster_partition_handling = autoheal
disk_free_limit.absolute = 256MB
vm_memory_high_watermark.relative = 0.1
EOF
  cat >"$dir/advanced.config" <<EOF
[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].
EOF
  say "rabbitmq$i: starting node $(cluster_rabbit_node "$i") on 127.0.0.1:$(cluster_rabbit_port "$i")"
  ( rabbit_env_node "$i"; "$RABBIT_BIN/rabbitmq-server" -detached ) >"$LOG_DIR/cluster/rabbitmq$i.out" 2>&1 \
    || die "rabbitmq$i: start failed; see $LOG_DIR/cluster/rabbitmq$i.out"
}

spark_home() {
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

spark_master_url() { echo "spark://127.0.0.1:$SPARK_MASTER_PORT"; }

spark_master_healthy() { curl -fsS -m 2 "http://127.0.0.1:$SPARK_UI_BASE_PORT/json/" >/dev/null 2>&1; }

# The master counts two ALIVE workers.
spark_workers_alive() {
  curl -fsS -m 2 "http://127.0.0.1:$SPARK_UI_BASE_PORT/json/" \
    | "$PY" -c 'import json,sys; w=[x for x in json.load(sys.stdin)["workers"] if x["state"]=="ALIVE"]; print(len(w)); sys.exit(len(w) < 2)'
}

# spark_launch NAME CLASS ARGS...: one Spark daemon from what the pyspark package ships (bin/spark-class).
spark_launch() {
  local name=$1; shift
  mkdir -p "$CLUSTER_DIR/$name" "$LOG_DIR/cluster"
  say "$name: starting ($*)"
  SPARK_LOCAL_IP=127.0.0.1 SPARK_WORKER_DIR="$CLUSTER_DIR/$name" SPARK_LOG_DIR="$LOG_DIR/cluster" \
    SPARK_HOME="$(spark_home)" PYSPARK_PYTHON="$PY" \
    nohup "$(spark_home)/bin/spark-class" "$@" >"$LOG_DIR/cluster/$name.log" 2>&1 &
  echo $! >"$CLUSTER_DIR/$name.pid"
}

cluster_spark_start() {
  if ! spark_master_healthy; then
    spark_launch spark-master org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$SPARK_MASTER_PORT" \
      --webui-port "$SPARK_UI_BASE_PORT"
    wait_for spark-master 90 spark_master_healthy "$LOG_DIR/cluster/spark-master.log"
  fi
  local i
  for i in 1 2; do
    pid_of "cluster/spark-worker$i" >/dev/null && continue
    spark_launch "spark-worker$i" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores 1 --memory 2g \
      --webui-port $((SPARK_UI_BASE_PORT + i)) --work-dir "$CLUSTER_DIR/spark-worker$i" "$(spark_master_url)"
  done
  wait_for "spark workers" 90 spark_workers_alive "$LOG_DIR/cluster/spark-worker*.log"
}

cluster_up() {
  [[ -x $PY ]] || die "no Python environment at $PY: run 'make install' first"
  command -v java >/dev/null || die "Spark and Cassandra need a JDK 17: apt-get install openjdk-17-jdk-headless"
  mkdir -p "$CLUSTER_DIR" "$LOG_DIR/cluster"
  rabbit_install
  cassandra_install
  minio_install
  secure_files
  minio_healthy >/dev/null 2>&1 || minio_start
  # Cassandra: node 1 (the seed) first, then nodes 2 and 3 together; RabbitMQ starts meanwhile.
  local i
  cluster_cassandra_healthy 1 >/dev/null 2>&1 || cluster_cassandra_launch 1
  # RabbitMQ: a blank node 1 first (the others join it); nodes that were clustered before all at
  # once, since a restarted member waits for its peers' tables before it answers.
  if [[ ! -d "$CLUSTER_DIR/rabbitmq1/mnesia/$(cluster_rabbit_node 1)" ]]; then
    cluster_rabbit_launch 1
    rabbit_ok_1() { cluster_rabbit_healthy 1; }
    wait_for rabbitmq1 120 rabbit_ok_1 "$LOG_DIR/cluster/rabbitmq1/"
  fi
  for i in 1 2 3; do
    pid_of "cluster/rabbitmq$i" >/dev/null || cluster_rabbit_launch "$i"
  done
  for i in 1 2 3; do
    eval "rabbit_ok_$i() { cluster_rabbit_healthy $i; }"
    wait_for "rabbitmq$i" 300 "rabbit_ok_$i" "$LOG_DIR/cluster/rabbitmq$i/"
  done
  wait_for "rabbitmq cluster (3 running nodes)" 60 cluster_rabbit_formed "$LOG_DIR/cluster/rabbitmq*/"
  cassandra1_ok() { cluster_cassandra_healthy 1; }
  wait_for cassandra1 180 cassandra1_ok "$LOG_DIR/cluster/cassandra1.log"
  for i in 2 3; do cluster_cassandra_healthy "$i" >/dev/null 2>&1 || cluster_cassandra_launch "$i"; done
  cluster_cassandra_wait_ring 480
  # Roles (system_auth replicated on the 3 nodes: a node down does not stop logins), users, policies.
  provision_backends 127.0.0.1:"$CLUSTER_CASSANDRA_PORT" 3
  cluster_spark_start
  cluster_status
}

cluster_down() {
  local i
  for i in 1 2 3; do
    pid_of "cluster/rabbitmq$i" >/dev/null || continue
    ( rabbit_env_node "$i"; "$RABBIT_BIN/rabbitmqctl" -q stop >/dev/null 2>&1 ) || stop_pid "cluster/rabbitmq$i"
  done
  for name in cassandra1 cassandra2 cassandra3 spark-worker1 spark-worker2 spark-master; do stop_pid "cluster/$name"; done
  say "clusters stopped (data kept in $CLUSTER_DIR; remove it for a clean slate)"
}

cluster_status() {
  local rc=0 i
  printf '%-18s %-18s %-8s %-8s %s\n' NODE ADDRESS PID MEM_MB HEALTH
  row() {  # row NAME ADDRESS CHECK...
    local name=$1 address=$2 pid mem=- health=healthy; shift 2
    pid=$(pid_of "cluster/$name") || pid=-
    [[ $pid != - ]] && mem=$(( $(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0) / 1024 ))
    [[ $pid != - ]] && grep -q '^State:.*stopped' "/proc/$pid/status" 2>/dev/null && health="STOPPED (SIGSTOP)"
    [[ $health == healthy ]] && ! "$@" >/dev/null 2>&1 && { health=DOWN; rc=1; }
    printf '%-18s %-18s %-8s %-8s %s\n' "$name" "$address" "$pid" "$mem" "$health"
  }
  for i in 1 2 3; do row "cassandra$i" "127.0.0.$i:$CLUSTER_CASSANDRA_PORT" cluster_cassandra_healthy "$i"; done
  for i in 1 2 3; do row "rabbitmq$i" "127.0.0.1:$(cluster_rabbit_port "$i")" cluster_rabbit_healthy "$i"; done
  row spark-master "127.0.0.1:$SPARK_MASTER_PORT" spark_master_healthy
  for i in 1 2; do row "spark-worker$i" "127.0.0.1" pid_of "cluster/spark-worker$i"; done
  local line
  line=$(cluster_cassandra_ring 2>/dev/null) && say "cassandra ring: 3 nodes up ($line)" || say "cassandra ring: not every node up ${line:+($line)}"
  line=$(cluster_rabbit_formed 2>/dev/null) && say "rabbitmq cluster: 3 running nodes ($line)" || say "rabbitmq cluster: not every node running ${line:+($line)}"
  printf '%-18s %-18s %-8s %-8s %s\n' minio "127.0.0.1:$MINIO_PORT" "$(pid_of minio || echo -)" - "$(minio_healthy >/dev/null 2>&1 && echo healthy || echo DOWN)"
  return $rc
}

# What a service needs to use the clusters: every contact point and every broker address.
cluster_env() {
  local urls="" i
  for i in 1 2 3; do urls+="${urls:+,}amqps://127.0.0.1:$(cluster_rabbit_port "$i")/%2F"; done
  cat <<EOF
$(env_of operator | grep -v -e CASSANDRA_HOSTS -e CASSANDRA_PORT -e RABBITMQ_URL -e TLS_CA_FILE)
MAILQUEUE_CASSANDRA_HOSTS=127.0.0.1,127.0.0.2,127.0.0.3
MAILQUEUE_CASSANDRA_PORT=$CLUSTER_CASSANDRA_PORT
MAILQUEUE_CASSANDRA_REPLICATION={'class': 'NetworkTopologyStrategy', 'datacenter1': 3}
MAILQUEUE_RABBITMQ_URLS=$urls
MAILQUEUE_SPARK_MASTER=$(spark_master_url)
EOF
}

# node ACTION NAME: faults on one cluster node.
node() {
  local action=$1 name=$2 pid i=${2: -1}
  [[ $name =~ ^(cassandra|rabbitmq)[123]$ ]] || die "node: NAME is cassandra1-3 or rabbitmq1-3, not '$name'"
  case $action in
    pid) pid_of "cluster/$name" || die "$name is not running" ;;
    kill|stop|cont)
      pid=$(pid_of "cluster/$name") || die "$name is not running"
      kill -"$( case $action in kill) echo KILL ;; stop) echo STOP ;; cont) echo CONT ;; esac )" "$pid"
      say "$name: SIG${action^^} sent to PID $pid" ;;
    start)
      if [[ $name == cassandra* ]]; then
        pid_of "cluster/$name" >/dev/null || cluster_cassandra_launch "$i"
        eval "node_ok() { cluster_cassandra_healthy $i; }"
        wait_for "$name" 240 node_ok "$LOG_DIR/cluster/$name.log"
      else
        pid_of "cluster/$name" >/dev/null || cluster_rabbit_launch "$i"
        eval "node_ok() { cluster_rabbit_healthy $i; }"
        wait_for "$name" 120 node_ok "$LOG_DIR/cluster/$name/"
      fi ;;
    *) die "node: ACTION is kill, stop, cont, start or pid" ;;
  esac
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

# The local CA, the certificates and one credential per role (each made once, kept in .stack/).
secure_files() {
  if ! command -v openssl >/dev/null; then
    say "openssl: installing from Debian (apt-get), for the local CA"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl; } >"$LOG_DIR/openssl-install.log" 2>&1 \
      || die "openssl: apt-get install openssl failed; see $LOG_DIR/openssl-install.log (needs root)"
  fi
  "$ROOT/stack/pki.sh" "$PKI_DIR"
  "$PY" "$ROOT/stack/provision.py" credentials "$CREDENTIALS_DIR"
}

# minio_plain_start: the second, plaintext MinIO of up --plaintext-loopback (an empty certs dir:
# MinIO serves TLS whenever it finds a certificate).
minio_plain_start() {
  mkdir -p "$STACK_DIR/minio-plain/data" "$STACK_DIR/minio-plain/certs" "$LOG_DIR"
  say "minio-plain: starting on http://127.0.0.1:$MINIO_PLAIN_PORT, in the clear, for the TLS benchmark (log $LOG_DIR/minio-plain.log)"
  minio_launch minio-plain "$MINIO_PLAIN_PORT" "$MINIO_PLAIN_CONSOLE_PORT"
  wait_for minio-plain 60 minio_plain_healthy "$LOG_DIR/minio-plain.log"
  "$PY" "$ROOT/stack/provision.py" minio "$CREDENTIALS_DIR" "127.0.0.1:$MINIO_PLAIN_PORT" "" "${S3_BUCKETS[@]}"
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

up() {
  [[ -x $PY ]] || die "no Python environment at $PY: run 'make install' first"
  mkdir -p "$STACK_DIR" "$LOG_DIR"
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
  rabbit_healthy >/dev/null 2>&1 || rabbit_start
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
  *) echo "usage: $0 up|down|status [--cluster] | up --plaintext-loopback | env [--plaintext-loopback] [ROLE] | node kill|stop|cont|start|pid NAME | cluster-env | env [ROLE] | rabbitmqctl [--node N] ARGS..." >&2; exit 2 ;;
esac
