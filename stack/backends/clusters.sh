# The clusters of up --cluster: three Cassandra nodes (127.0.0.1-3), three clustered RabbitMQ nodes,
# Spark standalone (a master and two workers); their start, stop, status, environment and node faults.
# Sourced by stack/stack.sh (its settings, say, die, wait_for, pid_of and stop_pid), which runs the commands.

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

# cluster_cassandra_relaunch_exited I: start node I again if its process exited (a joining node
# can give up on gossip, "Unable to gossip with any peers"), showing its last lines; dies when
# it exited three times. Counts in the caller's $relaunched.
cluster_cassandra_relaunch_exited() {
  local i=$1
  pid_of "cluster/cassandra$i" >/dev/null && return 0
  [[ $relaunched == *$i$i* ]] && die "cluster/cassandra$i exited three times; read $LOG_DIR/cluster/cassandra$i.log and .out"
  say "cluster/cassandra$i exited while starting; its last lines:"
  tail -n 15 "$LOG_DIR/cluster/cassandra$i.out" "$LOG_DIR/cluster/cassandra$i.log" >&2 2>/dev/null || true
  relaunched+=$i
  cluster_cassandra_launch "$i"
}

cluster_cassandra_last_errors() {
  say "cluster/cassandra$1 (pid $(pid_of "cluster/cassandra$1" || echo none)): its last warnings and errors:"
  grep -E " (WARN|ERROR) |Replaying|replay complete" "$LOG_DIR/cluster/cassandra$1.log" 2>/dev/null | tail -n 8 | cut -c1-300 >&2 || true
}

# cluster_cassandra_wait_node I SECONDS: node I answers CQL. A restarted node first replays its
# commit log (tens of seconds on a busy 2-core machine), then gossips with the seed; an exited
# process is started again (cluster_cassandra_relaunch_exited), progress said every 20 s.
cluster_cassandra_wait_node() {
  local i=$1 seconds=$2 start=$SECONDS relaunched=""
  until cluster_cassandra_healthy "$i" >/dev/null 2>&1; do
    cluster_cassandra_relaunch_exited "$i"
    if (( SECONDS - start > seconds )); then
      cluster_cassandra_last_errors "$i"
      die "cassandra$i did not answer within ${seconds}s. Read $LOG_DIR/cluster/cassandra$i.log, then run 'stack/stack.sh node start cassandra$i' again."
    fi
    (( (SECONDS - start) % 20 < 2 )) && say "waiting for cassandra$i ($((SECONDS - start))s): $(tail -n 1 "$LOG_DIR/cluster/cassandra$i.log" 2>/dev/null | cut -c1-160)"
    sleep 1
  done
  say "cassandra$i answers after $((SECONDS - start))s"
}

# cluster_cassandra_wait_ring SECONDS: wait until node 1 sees the three nodes up, saying which are
# up every 20 s. A node whose process exited meanwhile is shown (its last lines) and started again,
# twice at most; at the deadline, every node's last errors are shown before giving up.
cluster_cassandra_wait_ring() {
  local seconds=$1 start=$SECONDS line i relaunched=""
  until line=$(cluster_cassandra_ring 2>/dev/null); do
    for i in 2 3; do cluster_cassandra_relaunch_exited "$i"; done
    if (( SECONDS - start > seconds )); then
      for i in 1 2 3; do cluster_cassandra_last_errors "$i"; done
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
  # Every node lets the operator in before the status: a node asked for that role before it was
  # made caches its absence until a background refresh (roles_update_interval, 10 s), and a busy
  # node may miss the ping's 2 s connect. A clean-clone CI run failed here: the ring was formed
  # and provisioned, then cassandra3 showed DOWN in the status that ends `up`.
  for i in 1 2 3; do cluster_cassandra_wait_node "$i" 180; done
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
    # A running node is DOWN after three tries a second apart: one slow answer on a busy machine (a
    # 2 s connect) is no outage. No process: DOWN at once.
    if [[ $health == healthy ]]; then
      if [[ $pid == - ]]; then "$@" >/dev/null 2>&1 || { health=DOWN; rc=1; }
      else { "$@" || { sleep 1; "$@"; } || { sleep 1; "$@"; }; } >/dev/null 2>&1 || { health=DOWN; rc=1; }; fi
    fi
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
        cluster_cassandra_wait_node "$i" 420
      else
        pid_of "cluster/$name" >/dev/null || cluster_rabbit_launch "$i"
        eval "node_ok() { cluster_rabbit_healthy $i; }"
        wait_for "$name" 120 node_ok "$LOG_DIR/cluster/$name/"
      fi ;;
    *) die "node: ACTION is kill, stop, cont, start or pid" ;;
  esac
}
