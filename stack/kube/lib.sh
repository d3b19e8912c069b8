# The common part of the cluster scripts: versions, addresses, paths, output, waiting, the daemons'
# PID files, and the two ways files are written (templates/, manifests/). Sourced first by kube.sh
# (then by each job file through it) and by build.sh; it defines and runs nothing else.
#
# Layout (docs/pages/deploying/local-kubernetes.md explains each setting):
#   node IP / bridge cni0  10.244.0.1 (pods 10.244.0.0/24, no default route in pods)
#   services               10.96.0.0/24 (API 10.96.0.1, DNS 10.96.0.10), routed onto cni0 on the host
#   API server             https://10.244.0.1:6443 (bound to the bridge address only, not to eth0)
#   backends for pods      10.244.0.1:9042 (Cassandra), :5671 (RabbitMQ), :9000 (MinIO): socat forwarders
#                          to the local stack on 127.0.0.1 (stack/stack.sh up)
#   images                 imagePullPolicy: Never; mailqueue:latest and localhost/mailqueue:latest both
#                          name the imported project image
# State (certificates, kubeconfigs, etcd, logs, PID files) lives in $MAILQUEUE_STACK_DIR/kube (default
# .stack/kube); binaries in $MAILQUEUE_CACHE_DIR (default ~/.cache/mailqueue-stack), built by build.sh.

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STACK_DIR="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}"
KDIR="$STACK_DIR/kube"
CACHE_DIR="${MAILQUEUE_CACHE_DIR:-$HOME/.cache/mailqueue-stack}"
# Versions, in one place: build.sh builds these, the images and manifests name them.
KUBE_VERSION=v1.34.4
COREDNS_VERSION=1.11.3
METRICS_SERVER_VERSION=0.8.0
CRICTL_VERSION=1.34.0
KUBE_ROUTER_VERSION=2.1.0
BIN="$CACHE_DIR/kubernetes-$KUBE_VERSION/bin"
PKI="$KDIR/pki"
RUN="$KDIR/run"
LOGS="$KDIR/logs"
CONF="$KDIR/conf"
# The kustomizations of stack/kube/manifests, copied here with this machine's values (stage_manifests).
MANIFESTS="$KDIR/manifests"
CNI_CONF_DIR="$KDIR/cni/net.d"
CNI_IPAM_DIR="$KDIR/cni/ipam"
ADMIN_KUBECONFIG="$KDIR/admin.kubeconfig"
# kubectl: the one build.sh builds into hyperkube (same version as the cluster), unless set.
KUBECTL="${MAILQUEUE_KUBECTL:-$BIN/kubectl}"

NODE="${MAILQUEUE_KUBE_NODE:-$(hostname -s | tr '[:upper:]' '[:lower:]')}"
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
API_SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
BRIDGE=cni0
API="https://$NODE_IP:6443"
CONTAINERD_SOCK=/run/containerd/containerd.sock
CONTAINERD_TASKS=/run/containerd/io.containerd.runtime.v2.task/k8s.io
KUBELET_DIR=/var/lib/kubelet
PAUSE_IMAGE=localhost/mailqueue/pause:catatonit
COREDNS_IMAGE="localhost/mailqueue/coredns:$COREDNS_VERSION"
METRICS_SERVER_IMAGE="localhost/mailqueue/metrics-server:$METRICS_SERVER_VERSION"
NETTEST_IMAGE=localhost/mailqueue/nettest:1
# The local stack's ports (stack/stack.sh), forwarded from the node address for pods.
CASSANDRA_PORT="${MAILQUEUE_CASSANDRA_PORT:-9042}"
RABBITMQ_PORT="${MAILQUEUE_RABBITMQ_PORT:-5671}"
MINIO_PORT="${MAILQUEUE_MINIO_PORT:-9000}"
FORWARDS=("cassandra:$CASSANDRA_PORT" "rabbitmq:$RABBITMQ_PORT" "minio:$MINIO_PORT")

say() { printf '[kube] %s\n' "$*" >&2; }
die() { printf '[kube] ERROR: %s\n' "$*" >&2; exit 1; }

kc() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
crictl_() { "$BIN/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --image-endpoint "unix://$CONTAINERD_SOCK" --timeout 10s "$@"; }
# has_image REF: containerd has REF. grep reads the whole list: with -q it stops at the match, ctr
# dies of SIGPIPE on its next line and pipefail turned a yes into a no (5 of 40 tries here).
has_image() { ctr_ images ls -q 2>/dev/null | grep -xF "$1" >/dev/null; }

# ---------------------------------------------------------------- timing and waiting
T0=$EPOCHREALTIME
T_STEP=$EPOCHREALTIME
TIMINGS=()
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# timing LABEL: the time since the previous timing (and since the start), kept for the summary.
timing() {
  local line
  line=$(printf '%-44s %6ss  (at %ss)' "$1" "$(since "$T_STEP")" "$(since "$T0")")
  TIMINGS+=("$line")
  say "$line"
  T_STEP=$EPOCHREALTIME
}

# wait_for NAME SECONDS HINT CHECK...: poll CHECK (every 0.25 s) until it succeeds or the deadline passes.
wait_for() {
  local name=$1 seconds=$2 hint=$3 start=$EPOCHREALTIME next=10; shift 3
  until "$@" >/dev/null 2>&1; do
    local waited; waited=$(since "$start")
    if (( ${waited%.*} >= seconds )); then
      die "$name not ready within ${seconds}s. $hint Then run 'stack/kube/kube.sh down' and 'stack/kube/kube.sh up' again."
    fi
    if (( ${waited%.*} >= next )); then say "waiting for $name (${waited%.*}s)"; next=$((next + 10)); fi
    sleep 0.25
  done
  say "$name ready after $(since "$start")s"
}

# poll SECONDS CHECK...: CHECK until it succeeds (0) or SECONDS pass (1).
poll() {
  local secs=$1 t=$EPOCHREALTIME; shift
  until "$@" >/dev/null 2>&1; do
    (( $(since "$t" | cut -d. -f1) >= secs )) && return 1
    sleep 0.2
  done
}

# ---------------------------------------------------------------- processes
# alive PID: runs (an exited daemon stays a zombie until PID 1 reaps it, which can take seconds here).
alive() { local state; state=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null) && [[ -n $state && $state != Z ]]; }

# pid_of NAME: the PID of a daemon this script started, if it still runs the same program.
pid_of() {
  local f="$RUN/$1.pid" pid exe
  [[ -f $f ]] || return 1
  pid=$(<"$f"); exe=$(cat "$RUN/$1.exe" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  [[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -1)" == "$exe" ]] || return 1
  echo "$pid"
}

# daemon NAME "CONFIG FILES" CMD...: start CMD in its own session (log $LOGS/NAME.log) unless it
# already runs with the same command line and configuration; restart it if either changed.
daemon() {
  local name=$1 files=$2 want f; shift 2
  want=$({ printf '%s\n' "$@"; for f in $files; do cat "$f"; done; } | sha256sum | cut -c1-16)
  if pid_of "$name" >/dev/null; then
    [[ $(cat "$RUN/$name.hash" 2>/dev/null) == "$want" ]] && return 0
    say "$name: command line or configuration changed: restarting"
    stop_pid "$name"
  fi
  say "$name: starting (log $LOGS/$name.log)"
  printf '==== %s %s\n' "$(date -Is)" "$*" >>"$LOGS/$name.log"
  setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
  printf '%s' "$1" >"$RUN/$name.exe"
  echo "$want" >"$RUN/$name.hash"
}

# stop_pid NAME [SECONDS]: SIGTERM the daemon (and its direct children), SIGKILL after SECONDS (15).
stop_pid() {
  local name=$1 seconds=${2:-15} pid children start=$EPOCHREALTIME
  pid=$(pid_of "$name") || { rm -f "$RUN/$name.pid" "$RUN/$name.hash"; return 0; }
  children=$(ps -o pid= --ppid "$pid" 2>/dev/null | tr -d ' ' | tr '\n' ' ' || true)
  say "$name: stopping PID $pid"
  kill "$pid" 2>/dev/null || true
  while alive "$pid"; do
    if (( $(since "$start" | cut -d. -f1) >= seconds )); then
      say "$name: PID $pid did not stop within ${seconds}s: SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  # socat's per-connection children: end those of this PID only.
  local c
  for c in $children; do kill "$c" 2>/dev/null || true; done
  rm -f "$RUN/$name.pid" "$RUN/$name.hash"
}

# ---------------------------------------------------------------- files
# write_if_changed FILE: stdin into FILE unless FILE already holds exactly that (keeps hashes stable).
write_if_changed() {
  local tmp; tmp=$(mktemp "$1.XXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

# render TEMPLATE: stack/kube/templates/TEMPLATE with every @NAME@ replaced by the value of the shell
# variable NAME (a local of the caller counts); a name without a value is an error, not an empty string.
render() {
  local text name
  text=$(<"$HERE/templates/$1")
  while [[ $text =~ @([A-Z][A-Z0-9_]*)@ ]]; do
    name=${BASH_REMATCH[1]}
    [[ -v $name ]] || die "templates/$1: no value for @$name@"
    text=${text//"@$name@"/"${!name}"}
  done
  printf '%s\n' "$text"
}

# render_to TEMPLATE FILE: TEMPLATE rendered into FILE, written only when its text changed.
render_to() {
  local text; text=$(render "$1") || exit 1
  printf '%s\n' "$text" | write_if_changed "$2"
}

# stage_manifests: stack/kube/manifests copied into $MANIFESTS with what varies from machine to machine
# (kustomize reads files inside a kustomization only): values/values.env, the ConfigMap that the
# kustomizations' replacements read (images, the DNS address, the cluster CA), and metrics-server's
# certificate. Then `kubectl apply -k $MANIFESTS/NAME`.
stage_manifests() {
  local tmp; tmp=$(mktemp -d "$MANIFESTS.XXXX")
  cp -r "$HERE/manifests/." "$tmp/"
  {
    printf '%s=%s\n' COREDNS_IMAGE "$COREDNS_IMAGE" METRICS_SERVER_IMAGE "$METRICS_SERVER_IMAGE" \
      NETTEST_IMAGE "$NETTEST_IMAGE" DNS_IP "$DNS_IP"
    printf 'CA_BUNDLE=%s\n' "$(base64 -w0 "$PKI/ca.crt")"
  } >"$tmp/values/values.env"
  (umask 077; cp "$PKI/metrics-server.crt" "$PKI/metrics-server.key" "$tmp/addons/")
  rm -rf "$MANIFESTS"
  mv "$tmp" "$MANIFESTS"
}
