# MinIO: build (go install, once per machine), launch, and the second, plaintext server of
# up --plaintext-loopback.
# Sourced by stack/stack.sh (its settings, say, die, wait_for, pid_of and stop_pid), which runs the commands.

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

# minio_plain_start: the second, plaintext MinIO of up --plaintext-loopback (an empty certs dir:
# MinIO serves TLS whenever it finds a certificate).
minio_plain_start() {
  mkdir -p "$STACK_DIR/minio-plain/data" "$STACK_DIR/minio-plain/certs" "$LOG_DIR"
  say "minio-plain: starting on http://127.0.0.1:$MINIO_PLAIN_PORT, in the clear, for the TLS benchmark (log $LOG_DIR/minio-plain.log)"
  minio_launch minio-plain "$MINIO_PLAIN_PORT" "$MINIO_PLAIN_CONSOLE_PORT"
  wait_for minio-plain 60 minio_plain_healthy "$LOG_DIR/minio-plain.log"
  "$PY" "$ROOT/stack/provision.py" minio "$CREDENTIALS_DIR" "127.0.0.1:$MINIO_PLAIN_PORT" "" "${S3_BUCKETS[@]}"
}
