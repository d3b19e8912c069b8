# Cassandra: install (Maven Central, once per machine), launch one node (the single node or a cluster's),
# and ask a node whether it answers CQL itself.
# Sourced by stack/stack.sh (its settings, say, die, wait_for, pid_of and stop_pid), which runs the commands.

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

# cassandra_launch NAME ADDRESS PORT STORAGE_PORT HEAP CLUSTER SEEDS AUTO_BOOTSTRAP [JMX_PORT]: start one
# node in the background (data in $STACK_DIR/NAME, PID in $STACK_DIR/NAME.pid); the caller waits for
# it. JMX_PORT: local JMX (bound to loopback, as Cassandra's own cassandra-env.sh does by default) for
# nodetool; none without it (the cluster's nodes share one loopback).
cassandra_launch() {
  local name=$1 address=$2 port=$3 storage_port=$4 heap=$5 cluster=$6 seeds=$7 auto_bootstrap=$8 jmx_port=${9:-}
  local jmx=()
  [[ -n $jmx_port ]] && jmx=(-Dcassandra.jmx.local.port="$jmx_port")
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
    "${opens[@]}" "${jmx[@]}" \
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

# cassandra_nodetool ARGS...: nodetool against the single node's local JMX port (e.g. `flush`: the
# benches flush the memtables between phases, so that no phase pays for the one before it).
cassandra_nodetool() {
  exec "$(java17)" -Xmx128m --add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
    --add-exports java.base/jdk.internal.ref=ALL-UNNAMED --add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED \
    --add-opens java.base/sun.nio.ch=ALL-UNNAMED --add-opens java.base/java.io=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.nio=ALL-UNNAMED \
    -Dlogback.configurationFile="file://$ROOT/stack/cassandra/logback.xml" -Dmailqueue.cassandra.log=/dev/null \
    -Duser.home="$STACK_DIR" \
    -cp "$CASSANDRA_LIB/*" org.apache.cassandra.tools.NodeTool -h 127.0.0.1 -p "$CASSANDRA_JMX_PORT" "$@"
}

cassandra_start() {
  [[ $PLAINTEXT_LOOPBACK == 1 ]] && CASSANDRA_ENCRYPTION_OPTIONAL=true
  cassandra_launch cassandra 127.0.0.1 "$CASSANDRA_PORT" "$CASSANDRA_STORAGE_PORT" "$CASSANDRA_HEAP" mailqueue-local \
    "127.0.0.1:$CASSANDRA_STORAGE_PORT" true "$CASSANDRA_JMX_PORT"
  wait_for cassandra 180 cassandra_healthy "$LOG_DIR/cassandra.log (and $LOG_DIR/cassandra.out)"
}
