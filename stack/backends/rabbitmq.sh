# RabbitMQ: install (Debian, once per machine), each node's environment and TLS listener, the roles'
# users, and the single node's start and stop.
# Sourced by stack/stack.sh (its settings, say, die, wait_for, pid_of and stop_pid), which runs the commands.

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

# Healthy is the app running, not just the Erlang node answering: `rabbitmqctl stop_app` (the
# outage tests) leaves a node that pings but refuses every client.
rabbit_healthy() { ( rabbit_env; "$RABBIT_BIN/rabbitmq-diagnostics" -q -t 10 check_running ); }
rabbit_node_up() { ( rabbit_env; "$RABBIT_BIN/rabbitmq-diagnostics" -q ping ); }

# rabbit_ensure: start the node, or only its app when the node is up with the app stopped.
rabbit_ensure() {
  if rabbit_node_up >/dev/null 2>&1; then
    say "rabbitmq: node $RABBITMQ_NODE is up with its app stopped (rabbitmqctl stop_app): starting the app"
    ( rabbit_env; "$RABBIT_BIN/rabbitmqctl" -q start_app ) >>"$LOG_DIR/rabbitmq.out" 2>&1 \
      || die "rabbitmq: start_app failed; see $LOG_DIR/rabbitmq.out and $LOG_DIR/rabbitmq/"
    wait_for rabbitmq 300 rabbit_healthy "$LOG_DIR/rabbitmq/"
  else
    rabbit_start
  fi
}

rabbit_install() {
  [[ -x "$RABBIT_BIN/rabbitmq-server" ]] && return
  say "rabbitmq: installing rabbitmq-server from Debian (apt-get, about 20 s)"
  mkdir -p "$LOG_DIR"
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; } \
      >"$LOG_DIR/rabbitmq-install.log" 2>&1; then
    die "rabbitmq: apt-get install rabbitmq-server failed; see $LOG_DIR/rabbitmq-install.log (needs root)"
  fi
  # The package starts its own system service where it can, and enables it at boot, where it
  # would listen on every interface with Debian's defaults: stopped and disabled. Ours runs on its
  # own data folder, on loopback only.
  service rabbitmq-server stop >/dev/null 2>&1 || true
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable rabbitmq-server >/dev/null 2>&1 || true
  fi
  update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
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
  "$@" await_startup </dev/null >/dev/null
  # One eval for every user, its permissions and tags, and the guest user's removal.
  "$@" eval "$("$PY" "$ROOT/stack/provision.py" rabbitmq-users-eval "$CREDENTIALS_DIR")" </dev/null >/dev/null
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
  wait_for rabbitmq 300 rabbit_healthy "$LOG_DIR/rabbitmq/"
}

rabbit_stop() {
  local pid; pid=$(pid_of rabbitmq) || return 0
  ( rabbit_env; "$RABBIT_BIN/rabbitmqctl" -q stop >/dev/null 2>&1 ) || kill "$pid" 2>/dev/null || true
}
