#!/usr/bin/env bash
# A real single-node Kubernetes (v1.34) on this machine: plain background processes, no registry.
#
#   stack/kube/kube.sh up             build (once per machine), install packages (once), certificates,
#                                     start containerd, etcd, the control plane, kubelet, kube-proxy,
#                                     kube-router (NetworkPolicy only), CoreDNS, metrics-server and the
#                                     backend forwarders; wait until the node, DNS and `kubectl top` work
#   stack/kube/kube.sh down           stop exactly what `up` started, remove the pods' containers, the
#                                     bridge, the KUBE-* iptables chains and the service route (state and
#                                     binaries are kept: the next `up` is warm)
#   stack/kube/kube.sh status         one line per component: PID, healthy or not (exit 1 if any is down)
#   stack/kube/kube.sh env            print `export KUBECONFIG=...` (eval "$(stack/kube/kube.sh env)")
#   stack/kube/kube.sh import-images  podman's mailqueue:latest and mailqueue-sweep:latest into the
#                                     cluster's containerd (again only when podman's image id changed)
#   stack/kube/kube.sh secrets NS     the suite's Secrets in namespace NS from the local stack's CA and
#                                     credentials (.stack/pki, .stack/credentials): mailqueue-tls in the
#                                     shape cert-manager writes, mailqueue-backend-ca, and one
#                                     mailqueue-<component>-credentials per component; applied again
#                                     they are updated in place (rotation: pods see the new files)
#   stack/kube/kube.sh check          a throwaway end-to-end test in namespace mailqueue-kube-check:
#                                     cluster DNS from a pod, no default route in pods, a Service, a
#                                     NetworkPolicy enforced, `kubectl top`; removes its namespace
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
set -euo pipefail
set +m

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STACK_DIR="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}"
KDIR="$STACK_DIR/kube"
CACHE_DIR="${MAILQUEUE_CACHE_DIR:-$HOME/.cache/mailqueue-stack}"
KUBE_VERSION=v1.34.4
COREDNS_VERSION=1.11.3
METRICS_SERVER_VERSION=0.8.0
BIN="$CACHE_DIR/kubernetes-$KUBE_VERSION/bin"
PKI="$KDIR/pki"
RUN="$KDIR/run"
LOGS="$KDIR/logs"
CONF="$KDIR/conf"
MANIFESTS="$KDIR/manifests"
CNI_CONF_DIR="$KDIR/cni/net.d"
CNI_IPAM_DIR="$KDIR/cni/ipam"
ADMIN_KUBECONFIG="$KDIR/admin.kubeconfig"
KUBECTL="${MAILQUEUE_KUBECTL:-/usr/bin/kubectl}"

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
# The kubelet rewrites these at start: up puts the host's values back once the node is Ready.
KUBELET_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
# It also sets these (to the kernel's defaults, on this kernel): the cluster keeps the kubelet's values
# while it runs (containers' keyrings count against root's key quota); down puts the host's back.
KUBELET_SYSCTLS_RUNNING=(vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
TRIXIE_SOURCE=/etc/apt/sources.list.d/mailqueue-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/mailqueue-trixie
# Bump when the recipe of the locally made images changes: they are imported again.
IMAGE_RECIPE=1

say() { printf '[kube] %s\n' "$*" >&2; }
die() { printf '[kube] ERROR: %s\n' "$*" >&2; exit 1; }

kc() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
crictl_() { "$BIN/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --image-endpoint "unix://$CONTAINERD_SOCK" --timeout 10s "$@"; }

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

# ---------------------------------------------------------------- packages
packages() {
  local bookworm=() trixie=()
  [[ -x /usr/bin/containerd && -x /usr/bin/ctr ]] || trixie+=(containerd/trixie)
  [[ -x /usr/bin/etcd ]] || trixie+=(etcd-server/trixie)
  command -v runc >/dev/null || bookworm+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || bookworm+=(containernetworking-plugins)
  command -v iptables >/dev/null || bookworm+=(iptables)
  command -v conntrack >/dev/null || bookworm+=(conntrack)
  command -v ipset >/dev/null || bookworm+=(ipset)
  command -v catatonit >/dev/null || bookworm+=(catatonit)
  command -v socat >/dev/null || bookworm+=(socat)
  command -v openssl >/dev/null || bookworm+=(openssl)
  command -v curl >/dev/null || bookworm+=(curl)
  if (( ${#bookworm[@]} + ${#trixie[@]} )); then
    [[ $(id -u) == 0 ]] || die "packages ${bookworm[*]} ${trixie[*]} are installed with apt-get: run as root"
    mkdir -p "$LOGS"
    if (( ${#trixie[@]} )) && [[ ! -f $TRIXIE_SOURCE ]]; then
      say "adding Debian trixie as an apt source at Pin-Priority 100 (only what is asked for by name comes from it)"
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$TRIXIE_SOURCE"
      printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >"$TRIXIE_PIN"
    fi
    say "installing ${bookworm[*]} ${trixie[*]} from Debian (apt-get, about 30 s; log $LOGS/apt.log)"
    apt-get -o DPkg::Lock::Timeout=600 update -q >>"$LOGS/apt.log" 2>&1 \
      || die "apt-get update failed; see $LOGS/apt.log"
    local sim
    sim=$(apt-get -s install --no-install-recommends "${bookworm[@]}" "${trixie[@]}" 2>&1) \
      || die "apt-get cannot resolve ${bookworm[*]} ${trixie[*]}: $(tail -3 <<<"$sim")"
    if grep -E '^Inst [^ ]+ \[' <<<"$sim" >&2; then
      die "installing ${trixie[*]} would upgrade the installed packages above: refusing (the trixie pin must keep everything else on bookworm)"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
      "${bookworm[@]}" "${trixie[@]}" >>"$LOGS/apt.log" 2>&1 || die "apt-get install failed; see $LOGS/apt.log"
  fi
  # Debian puts the CNI plugins in /usr/lib/cni; containerd looks in /opt/cni/bin.
  mkdir -p /opt/cni/bin
  local p
  for p in /usr/lib/cni/*; do
    [[ -e /opt/cni/bin/${p##*/} ]] || ln -s "$p" "/opt/cni/bin/${p##*/}"
  done
}

# ---------------------------------------------------------------- certificates and kubeconfigs
key() {
  [[ -f $PKI/$1.key ]] && return 0
  (umask 077; openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$1.key" 2>/dev/null)
}

# ca NAME SUBJECT
ca() {
  [[ -f $PKI/$1.crt ]] && return 0
  key "$1"
  openssl req -x509 -new -key "$PKI/$1.key" -subj "$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$1.crt" 2>/dev/null
}

# cert CA NAME SUBJECT server|client|both [SANS]
cert() {
  local ca=$1 name=$2 subj=$3 kind=$4 san=${5:-} ext
  [[ -f $PKI/$name.crt ]] && return 0
  key "$name"
  ext=$'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature'
  case $kind in
    server) ext+=$'\nextendedKeyUsage=serverAuth' ;;
    client) ext+=$'\nextendedKeyUsage=clientAuth' ;;
    both) ext+=$'\nextendedKeyUsage=serverAuth,clientAuth' ;;
  esac
  [[ -n $san ]] && ext+=$'\nsubjectAltName='"$san"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" 2>/dev/null \
    | openssl x509 -req -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -set_serial "0x$(openssl rand -hex 16)" \
        -days 3650 -sha256 -extfile <(printf '%s\n' "$ext") -out "$PKI/$name.crt" 2>/dev/null
}

certificates() {
  mkdir -p "$PKI"
  ca ca "/CN=mailqueue-kubernetes-ca"
  ca front-proxy-ca "/CN=mailqueue-front-proxy-ca"
  cert ca apiserver "/CN=kube-apiserver" server \
    "IP:127.0.0.1,IP:$API_SERVICE_IP,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert ca admin "/O=system:masters/CN=mailqueue-admin" client
  cert ca controller-manager "/CN=system:kube-controller-manager" client
  cert ca scheduler "/CN=system:kube-scheduler" client
  cert ca kube-proxy "/CN=system:kube-proxy" client
  cert ca kube-router "/O=system:masters/CN=mailqueue-kube-router" client
  cert ca kubelet "/O=system:nodes/CN=system:node:$NODE" client
  cert ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
  cert ca kubelet-serving "/CN=$NODE" server "IP:$NODE_IP,IP:127.0.0.1,DNS:$NODE,DNS:localhost"
  cert front-proxy-ca front-proxy-client "/CN=front-proxy-client" client
  cert ca metrics-server "/CN=metrics-server.kube-system.svc" server \
    "DNS:metrics-server.kube-system.svc,DNS:metrics-server.kube-system.svc.cluster.local,DNS:metrics-server.kube-system,DNS:metrics-server"
  key sa
  [[ -f $PKI/sa.pub ]] || openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# kubeconfig NAME USER: $KDIR/NAME.kubeconfig with the certificate $PKI/NAME.crt embedded.
kubeconfig() {
  local file="$KDIR/$1.kubeconfig" tmp
  tmp=$(umask 077; mktemp "$file.XXXX")
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mailqueue
  cluster:
    server: $API
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$1.crt")
    client-key-data: $(base64 -w0 "$PKI/$1.key")
contexts:
- name: mailqueue
  context:
    cluster: mailqueue
    user: $2
current-context: mailqueue
EOF
  if cmp -s "$tmp" "$file"; then rm -f "$tmp"; else mv "$tmp" "$file"; fi
}

# write_if_changed FILE: stdin into FILE unless FILE already holds exactly that (keeps hashes stable).
write_if_changed() {
  local tmp; tmp=$(mktemp "$1.XXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

configs() {
  mkdir -p "$CONF" "$CNI_CONF_DIR" "$CNI_IPAM_DIR"
  kubeconfig admin mailqueue-admin
  kubeconfig controller-manager system:kube-controller-manager
  kubeconfig scheduler system:kube-scheduler
  kubeconfig kube-proxy system:kube-proxy
  kubeconfig kubelet "system:node:$NODE"
  kubeconfig kube-router mailqueue-kube-router
  local runc; runc=$(command -v runc)
  write_if_changed "$CONF/containerd.toml" <<EOF
# Written by stack/kube/kube.sh. restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so runc
# cannot lower the pause container's oom_score_adj (every pod failed with "can't get final child's PID").
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1
EOF
  # Pods: one bridge, host-local addresses, routes only to the pod and service ranges (no default
  # route, no masquerading: nothing leaves the machine).
  write_if_changed "$CNI_CONF_DIR/10-mailqueue.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "mailqueue",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$CNI_IPAM_DIR",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  write_if_changed "$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
# Pods get cluster DNS only: nothing of the host's resolver.
resolvConf: ""
# Images here cannot be pulled again (no registry): never garbage-collect them for disk usage.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 95
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
EOF
  write_if_changed "$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $KDIR/kube-proxy.kubeconfig
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
iptables:
  localhostNodePorts: false
# Leave the host's conntrack settings alone (0: do not set).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# ---------------------------------------------------------------- host network
network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    say "creating bridge $BRIDGE $NODE_IP/24 (the node address: the kubelet refuses a loopback one)"
    ip link add "$BRIDGE" type bridge
  fi
  ip -4 addr show dev "$BRIDGE" | grep -q "inet $NODE_IP/24" || ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # A ClusterIP that kube-proxy has not programmed yet stays on the bridge, never goes out of eth0.
  ip route show "$SERVICE_CIDR" | grep -q "dev $BRIDGE" || ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
}

# record_sysctls: the host's values, before the kubelet first starts (kept until down).
record_sysctls() {
  [[ -f $KDIR/host-sysctls ]] && return 0
  pid_of kubelet >/dev/null && return 0
  local k
  for k in "${KUBELET_SYSCTLS[@]}" "${KUBELET_SYSCTLS_RUNNING[@]}"; do printf '%s=%s\n' "$k" "$(sysctl -n "$k")"; done >"$KDIR/host-sysctls"
}

# restore_sysctls [all]: put back the host's values of KUBELET_SYSCTLS (with all: every recorded one).
restore_sysctls() {
  [[ -f $KDIR/host-sysctls ]] || return 0
  local k v changed=()
  while IFS== read -r k v; do
    [[ ${1:-} == all || " ${KUBELET_SYSCTLS[*]} " == *" $k "* ]] || continue
    [[ $(sysctl -n "$k") == "$v" ]] && continue
    sysctl -q -w "$k=$v" >/dev/null && changed+=("$k=$v")
  done <"$KDIR/host-sysctls"
  (( ${#changed[@]} )) && say "restored the host's sysctls the kubelet changed: ${changed[*]}"
  return 0
}

# ---------------------------------------------------------------- images
# make_image REF ENTRYPOINT_JSON SRC:DEST...: a FROM-scratch image of static binaries, written as a
# docker-archive (what `podman save --format docker-archive` writes) and imported into containerd.
# Skipped when containerd has REF made from the same files.
make_image() {
  local ref=$1 entry=$2 pair src dst sum work diff cfg; shift 2
  sum=$({ echo "$IMAGE_RECIPE $ref $entry"; for pair; do stat -L -c '%n %s %Y' "${pair%%:*}"; done; } | sha256sum | cut -c1-16)
  local mark="$KDIR/images/${ref//[\/:]/_}.sum"
  if [[ $(cat "$mark" 2>/dev/null) == "$sum" ]] && ctr_ images ls -q 2>/dev/null | grep -qxF "$ref"; then return 0; fi
  mkdir -p "$KDIR/images"
  work=$(mktemp -d "$KDIR/images/build.XXXX")
  mkdir -p "$work/rootfs/etc" "$work/rootfs/tmp"
  chmod 1777 "$work/rootfs/tmp"
  printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/:/nonexistent\n' >"$work/rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$work/rootfs/etc/group"
  for pair; do
    src=${pair%%:*}; dst=${pair#*:}
    install -D -m 0755 "$src" "$work/rootfs$dst"
  done
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" .
  diff=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir "$work/$diff"; mv "$work/layer.tar" "$work/$diff/layer.tar"
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":%s,"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"stack/kube/kube.sh make_image"}]}' \
    "$entry" "$diff" >"$work/config.json"
  cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$ref" "$diff" >"$work/manifest.json"
  tar -C "$work" -cf "$work/image.tar" manifest.json "$cfg.json" "$diff/layer.tar"
  ctr_ images import "$work/image.tar" >/dev/null 2>"$work/import.err" \
    || die "importing $ref into containerd failed: $(cat "$work/import.err")"
  ctr_ images label "$ref" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
  rm -rf "$work"
  echo "$sum" >"$mark"
  say "image $ref imported into containerd"
}

local_images() {
  local catatonit; catatonit=$(command -v catatonit)
  file -L "$catatonit" | grep -Eq 'statically linked|static-pie linked' || die "$catatonit is not statically linked: the pause image needs a static catatonit"
  make_image "$PAUSE_IMAGE" '["/catatonit","-P"]' "$catatonit:/catatonit"
  make_image "$COREDNS_IMAGE" '["/coredns"]' "$BIN/coredns:/coredns"
  make_image "$METRICS_SERVER_IMAGE" '["/metrics-server"]' "$BIN/metrics-server:/metrics-server"
  make_image "$NETTEST_IMAGE" '["/nettest"]' "$BIN/nettest:/nettest"
}

# import-images: podman's project images into containerd, again only when podman's image id changed.
import_images() {
  local img id mark tmp
  if ! command -v podman >/dev/null; then say "import-images: podman is not installed: no project images to import (stack/image.sh build)"; return 0; fi
  pid_of containerd >/dev/null || die "import-images: containerd is not running: run 'stack/kube/kube.sh up' first"
  mkdir -p "$KDIR/images"
  for img in mailqueue:latest mailqueue-sweep:latest; do
    id=$(podman image inspect --format '{{.Id}}' "$img" 2>/dev/null) || { say "import-images: podman has no $img (stack/image.sh build makes it): skipped"; continue; }
    mark="$KDIR/images/${img//:/_}.podman-id"
    if [[ $(cat "$mark" 2>/dev/null) == "$id" ]] && ctr_ images ls -q | grep -qxF "docker.io/library/$img"; then
      say "import-images: $img unchanged (podman id ${id:0:12}): skipped"; continue
    fi
    local start=$EPOCHREALTIME
    tmp=$(mktemp "$KDIR/images/save.XXXX")
    podman save --format docker-archive -o "$tmp.tar" "$img" >/dev/null 2>"$tmp.err" || { cat "$tmp.err" >&2; rm -f "$tmp"*; die "podman save $img failed"; }
    # podman names it localhost/NAME:TAG; pods may write NAME:TAG, which the CRI reads as docker.io/library/NAME:TAG.
    ctr_ images import "$tmp.tar" >/dev/null 2>"$tmp.err" || { cat "$tmp.err" >&2; rm -f "$tmp"*; die "ctr import of $img failed"; }
    rm -f "$tmp"*
    ctr_ images tag --force "localhost/$img" "docker.io/library/$img" >/dev/null
    ctr_ images label "localhost/$img" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
    ctr_ images label "docker.io/library/$img" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
    echo "$id" >"$mark"
    say "import-images: $img (podman id ${id:0:12}) imported as $img and localhost/$img in $(since "$start")s"
  done
}

# ---------------------------------------------------------------- health checks
containerd_healthy() { pid_of containerd >/dev/null && ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; }
etcd_healthy() { pid_of etcd >/dev/null && curl -fsS --max-time 2 http://127.0.0.1:2379/health | grep -q '"health":"true"'; }
api_get() { curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API$1"; }
apiserver_healthy() { pid_of kube-apiserver >/dev/null && [[ $(api_get /readyz) == ok ]]; }
controller_manager_healthy() { pid_of kube-controller-manager >/dev/null && [[ $(curl -fsSk --max-time 2 https://127.0.0.1:10257/healthz) == ok ]]; }
scheduler_healthy() { pid_of kube-scheduler >/dev/null && [[ $(curl -fsSk --max-time 2 https://127.0.0.1:10259/healthz) == ok ]]; }
kubelet_healthy() { pid_of kubelet >/dev/null && [[ $(curl -fsS --max-time 2 http://127.0.0.1:10248/healthz) == ok ]]; }
kube_proxy_healthy() { pid_of kube-proxy >/dev/null && curl -fsS --max-time 2 http://127.0.0.1:10256/healthz >/dev/null; }
# kube-router's health server listens on every interface: it is off, so: running, and its chains are in place.
kube_router_healthy() { pid_of kube-router >/dev/null && iptables -w -t filter -S KUBE-ROUTER-FORWARD >/dev/null 2>&1; }
forward_healthy() { pid_of "forward-$1" >/dev/null && ss -Hltn "sport = :$2" | grep -q "$NODE_IP:$2"; }
# node_ready: Ready, as reported by the kubelet that runs now (after a restart the node object still
# says Ready from before, until the node controller notices).
node_ready() {
  local ready beat started pid
  pid=$(pid_of kubelet) || return 1
  read -r ready beat < <(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}{"\n"}' 2>/dev/null) || return 1
  started=$(( $(date +%s) - $(ps -o etimes= -p "$pid") - 1 ))
  [[ $ready == True ]] && (( $(date -d "$beat" +%s) >= started ))
}
deployment_ready() {
  local ready want
  read -r ready want < <(kc -n "$1" get deploy "$2" -o jsonpath='{.status.availableReplicas} {.spec.replicas}{"\n"}' 2>/dev/null) || return 1
  [[ -n $ready && $ready == "$want" ]]
}
# coredns_ready: it answers, through its Service (kube-proxy): the Deployment's status may be stale.
coredns_ready() {
  deployment_ready kube-system coredns \
    && [[ $("$BIN/nettest" resolve kubernetes.default.svc.cluster.local "$DNS_IP:53" 2>/dev/null) == "$API_SERVICE_IP" ]]
}
metrics_ready() { kc top nodes --no-headers 2>/dev/null | grep -q "^$NODE "; }

# ---------------------------------------------------------------- components
start_containerd() {
  daemon containerd "$CONF/containerd.toml" /usr/bin/containerd --config "$CONF/containerd.toml"
  wait_for containerd 30 "Read $LOGS/containerd.log." containerd_healthy
}

start_etcd() {
  mkdir -p "$KDIR/etcd"; chmod 700 "$KDIR/etcd"
  daemon etcd "" /usr/bin/etcd --name=mailqueue --data-dir="$KDIR/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=mailqueue=http://127.0.0.1:2380 --listen-metrics-urls=http://127.0.0.1:2381 \
    --log-level=warn
  wait_for etcd 30 "Read $LOGS/etcd.log." etcd_healthy
}

start_apiserver() {
  daemon kube-apiserver "" "$BIN/kube-apiserver" \
    --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port=6443 \
    --etcd-servers=http://127.0.0.1:2379 \
    --service-cluster-ip-range="$SERVICE_CIDR" --service-node-port-range=30000-32767 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --client-ca-file="$PKI/ca.crt" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --profiling=false --event-ttl=1h
  wait_for kube-apiserver 90 "Read $LOGS/kube-apiserver.log." apiserver_healthy
}

start_controllers() {
  daemon kube-controller-manager "" "$BIN/kube-controller-manager" \
    --kubeconfig="$KDIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$KDIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$KDIR/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --allocate-node-cidrs=true --cluster-cidr="$POD_CIDR" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
    --use-service-account-credentials=true --profiling=false
  daemon kube-scheduler "" "$BIN/kube-scheduler" \
    --kubeconfig="$KDIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$KDIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$KDIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

start_node() {
  record_sysctls
  daemon kubelet "$CONF/kubelet.yaml" "$BIN/kubelet" --config="$CONF/kubelet.yaml" \
    --kubeconfig="$KDIR/kubelet.kubeconfig" --hostname-override="$NODE" --node-ip="$NODE_IP"
  daemon kube-proxy "$CONF/kube-proxy.yaml" "$BIN/kube-proxy" --config="$CONF/kube-proxy.yaml"
}

start_forwards() {
  local f name port
  for f in "${FORWARDS[@]}"; do
    name=${f%%:*}; port=${f#*:}
    daemon "forward-$name" "" /usr/bin/socat "TCP-LISTEN:$port,bind=$NODE_IP,reuseaddr,fork" "TCP:127.0.0.1:$port"
  done
  for f in "${FORWARDS[@]}"; do
    name=${f%%:*}; port=${f#*:}
    eval "fwd_ok() { forward_healthy $name $port; }"
    wait_for "forward-$name ($NODE_IP:$port -> 127.0.0.1:$port)" 10 "Read $LOGS/forward-$name.log." fwd_ok
  done
}

start_kube_router() {
  daemon kube-router "" "$BIN/kube-router" --kubeconfig="$KDIR/kube-router.kubeconfig" \
    --hostname-override="$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
    --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    --service-cluster-ip-range="$SERVICE_CIDR" --service-node-port-range=30000-32767 \
    --health-port=0 --metrics-port=0
  wait_for kube-router 60 "Read $LOGS/kube-router.log." kube_router_healthy
}

# ---------------------------------------------------------------- add-ons
manifests() {
  mkdir -p "$MANIFESTS"
  local ca_b64; ca_b64=$(base64 -w0 "$PKI/ca.crt")
  write_if_changed "$MANIFESTS/coredns.yaml" <<EOF
# CoreDNS: cluster names only (kubernetes plugin), no forward: nothing goes to the host's resolver.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        prometheus :9153
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        resources:
          requests: {cpu: 50m, memory: 32Mi}
          limits: {memory: 170Mi}
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
          periodSeconds: 10
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities:
            add: [NET_BIND_SERVICE]
            drop: [ALL]
      volumes:
      - name: config
        configMap:
          name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
spec:
  clusterIP: $DNS_IP
  selector:
    k8s-app: kube-dns
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
EOF
  write_if_changed "$MANIFESTS/metrics-server.yaml" <<EOF
# metrics-server: resource metrics for \`kubectl top\` and the HPA. It checks the kubelet's serving
# certificate against the cluster CA; the API server checks metrics-server's against the same CA.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: metrics-server
  namespace: kube-system
  labels: {k8s-app: metrics-server}
---
apiVersion: v1
kind: Secret
metadata:
  name: metrics-server-tls
  namespace: kube-system
type: kubernetes.io/tls
data:
  tls.crt: $(base64 -w0 "$PKI/metrics-server.crt")
  tls.key: $(base64 -w0 "$PKI/metrics-server.key")
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:aggregated-metrics-reader
  labels:
    k8s-app: metrics-server
    rbac.authorization.k8s.io/aggregate-to-admin: "true"
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
    rbac.authorization.k8s.io/aggregate-to-view: "true"
rules:
- apiGroups: [metrics.k8s.io]
  resources: [pods, nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
  labels: {k8s-app: metrics-server}
rules:
- apiGroups: [""]
  resources: [nodes/metrics]
  verbs: [get]
- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: kube-system
  labels: {k8s-app: metrics-server}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
  labels: {k8s-app: metrics-server}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
  labels: {k8s-app: metrics-server}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
  labels: {k8s-app: metrics-server}
spec:
  selector: {k8s-app: metrics-server}
  ports:
  - {name: https, port: 443, protocol: TCP, targetPort: https}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: metrics-server
  namespace: kube-system
  labels: {k8s-app: metrics-server}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: metrics-server}
  strategy:
    rollingUpdate: {maxUnavailable: 1}
  template:
    metadata:
      labels: {k8s-app: metrics-server}
    spec:
      serviceAccountName: metrics-server
      priorityClassName: system-cluster-critical
      containers:
      - name: metrics-server
        image: $METRICS_SERVER_IMAGE
        imagePullPolicy: Never
        args:
        - --secure-port=10250
        - --tls-cert-file=/certs/tls.crt
        - --tls-private-key-file=/certs/tls.key
        - --kubelet-preferred-address-types=InternalIP
        - --kubelet-use-node-status-port
        - --kubelet-certificate-authority=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        - --metric-resolution=10s
        - --kubelet-request-timeout=5s
        ports:
        - {name: https, containerPort: 10250, protocol: TCP}
        readinessProbe:
          httpGet: {path: /readyz, port: https, scheme: HTTPS}
          periodSeconds: 2
          failureThreshold: 3
        livenessProbe:
          httpGet: {path: /livez, port: https, scheme: HTTPS}
          periodSeconds: 10
          failureThreshold: 3
        resources:
          requests: {cpu: 50m, memory: 64Mi}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          runAsNonRoot: true
          runAsUser: 1000
          capabilities:
            drop: [ALL]
        volumeMounts:
        - {name: certs, mountPath: /certs, readOnly: true}
        - {name: tmp, mountPath: /tmp}
      volumes:
      - name: certs
        secret:
          secretName: metrics-server-tls
      - name: tmp
        emptyDir: {}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
  labels: {k8s-app: metrics-server}
spec:
  service:
    name: metrics-server
    namespace: kube-system
    port: 443
  group: metrics.k8s.io
  version: v1beta1
  caBundle: $ca_b64
  groupPriorityMinimum: 100
  versionPriority: 100
EOF
}

apply_addons() {
  manifests
  local sum; sum=$(cat "$MANIFESTS"/*.yaml | sha256sum | cut -c1-16)
  if [[ $(cat "$KDIR/addons.applied" 2>/dev/null) == "$sum" ]] \
      && kc -n kube-system get deploy coredns metrics-server >/dev/null 2>&1; then
    return 0
  fi
  kc apply -f "$MANIFESTS" >"$LOGS/addons.log" 2>&1 || die "kubectl apply of $MANIFESTS failed; see $LOGS/addons.log"
  echo "$sum" >"$KDIR/addons.applied"
  say "add-ons applied: CoreDNS ($DNS_IP), metrics-server (v1beta1.metrics.k8s.io)"
}

# ---------------------------------------------------------------- check
CHECK_NS=mailqueue-kube-check
# in_pod POD ARGS...: run nettest ARGS in a check pod.
in_pod() { local pod=$1; shift; kc -n "$CHECK_NS" exec "$pod" -- /nettest "$@"; }
# poll SECONDS CHECK...: CHECK until it succeeds (0) or SECONDS pass (1).
poll() {
  local secs=$1 t=$EPOCHREALTIME; shift
  until "$@" >/dev/null 2>&1; do
    (( $(since "$t" | cut -d. -f1) >= secs )) && return 1
    sleep 0.2
  done
}

check() {
  node_ready || die "the cluster is not up: run 'stack/kube/kube.sh up' first"
  local start=$EPOCHREALTIME failures=0 out svc_ip t f
  ok() { say "check OK:     $*"; }
  bad() { say "check FAILED: $*"; failures=$((failures + 1)); }
  kc delete namespace "$CHECK_NS" --ignore-not-found --wait=true >/dev/null
  trap 'kc delete namespace "$CHECK_NS" --wait=false >/dev/null 2>&1 || true' EXIT
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $CHECK_NS
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: $CHECK_NS, labels: {app: server}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: nettest
    image: $NETTEST_IMAGE
    imagePullPolicy: Never
    args: [serve, ":8080"]
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: allowed, namespace: $CHECK_NS, labels: {role: allowed}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: nettest, image: $NETTEST_IMAGE, imagePullPolicy: Never, args: [sleep]}]
---
apiVersion: v1
kind: Pod
metadata: {name: denied, namespace: $CHECK_NS, labels: {role: denied}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: nettest, image: $NETTEST_IMAGE, imagePullPolicy: Never, args: [sleep]}]
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: $CHECK_NS}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080}]
EOF
  kc -n "$CHECK_NS" wait --for=condition=Ready pod --all --timeout=60s >/dev/null \
    || die "check pods not Ready within 60s: kubectl -n $CHECK_NS describe pods"
  ok "3 pods Ready in $(since "$start")s"
  svc_ip=$(kc -n "$CHECK_NS" get svc server -o jsonpath='{.spec.clusterIP}')
  if out=$(in_pod allowed resolve "server.$CHECK_NS.svc.cluster.local" 2>&1) && [[ $out == "$svc_ip" ]]; then
    ok "cluster DNS from a pod: server.$CHECK_NS.svc.cluster.local -> $out"
  else bad "DNS server.$CHECK_NS.svc.cluster.local: $out (want $svc_ip)"; fi
  if out=$(in_pod allowed resolve kubernetes.default 2>&1) && [[ $out == "$API_SERVICE_IP" ]]; then
    ok "search path: kubernetes.default -> $out"
  else bad "DNS kubernetes.default: $out"; fi
  if out=$(in_pod allowed resolve example.com 2>&1); then bad "example.com resolved ($out): DNS reaches beyond the cluster"
  else ok "names outside the cluster do not resolve (no forward): ${out%%$'\n'*}"; fi
  if out=$(in_pod allowed routes 2>&1); then ok "no default route in pods: $(tr '\n' ';' <<<"$out")"; else bad "pod routes: $out"; fi
  # A new Service answers shortly after its pods are Ready (kube-proxy): poll, do not sleep.
  if poll 15 in_pod denied dial server:80 1; then ok "Service server:80 ($svc_ip) answers a pod"; else bad "Service server:80 does not answer"; fi
  if out=$(in_pod allowed connect "$API_SERVICE_IP:443" 2>&1); then ok "API server from a pod: $out"; else bad "$API_SERVICE_IP:443 from a pod: $out"; fi
  for f in "${FORWARDS[@]}"; do
    if out=$(in_pod allowed connect "$NODE_IP:${f#*:}" 2>&1); then ok "backend forward ${f%%:*}: $out"; else bad "backend forward ${f%%:*}: $out"; fi
  done
  # NetworkPolicy (kube-router): only role=allowed may reach the server.
  kc apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-allowed, namespace: $CHECK_NS}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: allowed}}}]
    ports: [{port: 8080}]
EOF
  t=$EPOCHREALTIME
  denied_blocked() { ! in_pod denied dial server:80 1; }
  if poll 30 denied_blocked; then
    out=$(in_pod denied dial server:80 1 2>&1 || true)
    ok "NetworkPolicy enforced $(since "$t")s after it was created: role=denied cannot reach the server (${out%%$'\n'*})"
    if in_pod allowed dial server:80 2 >/dev/null 2>&1; then ok "NetworkPolicy: role=allowed still reaches the server"; else bad "NetworkPolicy blocks role=allowed too"; fi
    if in_pod denied connect "$NODE_IP:10250" >/dev/null 2>&1; then ok "NetworkPolicy: the denied pod still reaches the node (the policy selects the server only)"; else bad "the denied pod lost the node"; fi
    kc -n "$CHECK_NS" delete networkpolicy server-from-allowed >/dev/null
    t=$EPOCHREALTIME
    if poll 30 in_pod denied dial server:80 1; then ok "policy removed: role=denied reaches the server again after $(since "$t")s"; else bad "policy removed but role=denied still blocked"; fi
  else
    bad "NetworkPolicy NOT enforced within 30s (kube-router: $LOGS/kube-router.log)"
  fi
  if out=$(kc top nodes --no-headers 2>&1); then ok "kubectl top nodes: $out"; else bad "kubectl top nodes: $out"; fi
  if out=$(kc top pods -n kube-system --no-headers 2>&1); then ok "kubectl top pods -n kube-system: $(tr -s ' \n' ' ;' <<<"$out")"; else bad "kubectl top pods: $out"; fi
  if ctr_ images ls -q 2>/dev/null | grep -qxF docker.io/library/mailqueue:latest; then
    kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: python, namespace: $CHECK_NS}
spec:
  restartPolicy: Never
  containers:
  - name: python
    image: mailqueue:latest
    imagePullPolicy: Never
    command: [python, -c, "import socket; print(socket.gethostbyname('server.$CHECK_NS.svc.cluster.local'))"]
EOF
    phase_done() { [[ $(kc -n "$CHECK_NS" get pod python -o jsonpath='{.status.phase}') =~ ^(Succeeded|Failed)$ ]]; }
    if poll 90 phase_done && [[ $(kc -n "$CHECK_NS" logs python 2>&1) == "$svc_ip" ]]; then
      ok "a mailqueue:latest pod (python) resolves server.$CHECK_NS via cluster DNS: $svc_ip"
    else
      bad "mailqueue:latest python pod: $(kc -n "$CHECK_NS" logs python 2>&1 | tail -3)"
    fi
  else
    say "check: containerd has no mailqueue:latest (stack/image.sh build, then stack/kube/kube.sh import-images): python pod skipped"
  fi
  say "check finished in $(since "$start")s: $failures failure(s)"
  (( failures == 0 ))
}

# ---------------------------------------------------------------- commands
up() {
  [[ $(id -u) == 0 ]] || die "the cluster needs root (containerd, iptables, the bridge): run as root"
  [[ -x $KUBECTL ]] || die "no kubectl at $KUBECTL (set MAILQUEUE_KUBECTL)"
  mkdir -p "$KDIR" "$RUN" "$LOGS"
  "$HERE/build.sh" >&2 || die "stack/kube/build.sh failed (see above)"
  timing "build (cached: $BIN)"
  packages
  timing "packages (apt, once per machine)"
  certificates
  configs
  timing "certificates, kubeconfigs, configs"
  network
  start_containerd
  local_images
  timing "bridge, containerd, local images"
  start_etcd
  start_apiserver
  timing "etcd, kube-apiserver"
  start_controllers
  start_node
  start_forwards
  apply_addons
  timing "controllers, kubelet, kube-proxy, add-ons applied"
  wait_for "node $NODE" 120 "Read $LOGS/kubelet.log and $LOGS/containerd.log." node_ready
  restore_sysctls
  wait_for kube-controller-manager 60 "Read $LOGS/kube-controller-manager.log." controller_manager_healthy
  wait_for kube-scheduler 60 "Read $LOGS/kube-scheduler.log." scheduler_healthy
  wait_for kube-proxy 60 "Read $LOGS/kube-proxy.log." kube_proxy_healthy
  timing "node Ready"
  start_kube_router
  timing "kube-router (NetworkPolicy)"
  wait_for CoreDNS 120 "Run 'kubectl -n kube-system describe pod -l k8s-app=kube-dns' (KUBECONFIG=$ADMIN_KUBECONFIG)." coredns_ready
  timing "CoreDNS ready"
  wait_for "metrics API (kubectl top nodes)" 180 "Run 'kubectl -n kube-system logs deploy/metrics-server' and 'kubectl get apiservice v1beta1.metrics.k8s.io' (KUBECONFIG=$ADMIN_KUBECONFIG)." metrics_ready
  timing "metrics API (kubectl top nodes)"
  import_images
  timing "project images"
  status || die "a component is not healthy (see above)"
  say "cluster up in $(since "$T0")s. Use it with: eval \"\$(stack/kube/kube.sh env)\""
  say "timings:"
  local t; for t in "${TIMINGS[@]}"; do say "  $t"; done
}

# iptables_cleanup: remove every KUBE-* chain (kube-proxy, kubelet, kube-router) and the jumps into
# them, in IPv4 and IPv6, table by table; other chains (podman's, CNI's portmap) are left alone.
iptables_cleanup() {
  local ipt t line chain chains
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null || continue
    for t in filter nat mangle raw; do
      while IFS= read -r line; do
        eval "$ipt -w -t $t -D ${line#-A }" 2>/dev/null || true
      done < <("$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A ' | grep -Ev '^-A KUBE-' | grep -E -- '-j KUBE-' || true)
      chains=$("$ipt-save" -t "$t" 2>/dev/null | sed -nE 's/^:(KUBE-[^ ]+) .*/\1/p')
      for chain in $chains; do "$ipt" -w -t "$t" -F "$chain" 2>/dev/null || true; done
      for chain in $chains; do "$ipt" -w -t "$t" -X "$chain" 2>/dev/null || true; done
    done
  done
  if command -v ipset >/dev/null; then
    local set
    for set in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router-)' || true); do ipset destroy "$set" 2>/dev/null || true; done
  fi
}

# remove_pods: every pod sandbox and container of the cluster, while containerd runs (starting it for
# that if it is down but left containers behind).
remove_pods() {
  if [[ -z $(ls -A "$CONTAINERD_TASKS" 2>/dev/null) ]] && ! pid_of containerd >/dev/null; then return 0; fi
  if ! containerd_healthy; then
    [[ -f $CONF/containerd.toml ]] || return 0
    say "containerd is down but left containers behind: starting it to remove them"
    daemon containerd "$CONF/containerd.toml" /usr/bin/containerd --config "$CONF/containerd.toml"
    wait_for containerd 30 "Read $LOGS/containerd.log." containerd_healthy
  fi
  local n; n=$(crictl_ pods -q 2>/dev/null | wc -l)
  if (( n )); then
    say "removing $n pod sandboxes and their containers"
    crictl_ rmp -fa >/dev/null 2>&1 || true
  fi
  local c
  for c in $(ctr_ containers ls -q 2>/dev/null); do
    ctr_ tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
    ctr_ tasks delete -f "$c" >/dev/null 2>&1 || true
    ctr_ containers rm "$c" >/dev/null 2>&1 || true
  done
}

down() {
  [[ $(id -u) == 0 ]] || die "run as root"
  mkdir -p "$RUN"
  local start=$EPOCHREALTIME
  # kube-router's own --cleanup-config cleans its policy rules, then panics in its IPVS cleanup (no
  # IPVS here): iptables_cleanup below removes its chains and ipsets instead.
  stop_pid kube-router
  stop_pid kubelet
  remove_pods
  local name
  for name in kube-proxy kube-scheduler kube-controller-manager kube-apiserver; do stop_pid "$name"; done
  stop_pid etcd 30
  stop_pid containerd 30
  local f; for f in "${FORWARDS[@]}"; do stop_pid "forward-${f%%:*}"; done
  # What the kubelet and the CRI mounted for pods (projected tokens, secrets, network namespaces).
  local m
  for m in $(awk -v d="$KUBELET_DIR" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for m in /run/netns/cni-*; do
    [[ -e $m ]] || continue
    umount "$m" 2>/dev/null || true; rm -f "$m"
  done
  [[ -z $(ls -A "$CONTAINERD_TASKS" 2>/dev/null) ]] && rm -rf "${CNI_IPAM_DIR:?}"/*
  iptables_cleanup
  ip route del "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  restore_sysctls all
  rm -f "$KDIR/host-sysctls"
  say "cluster stopped in $(since "$start")s (state kept in $KDIR; binaries in $BIN; remove $KDIR for a clean slate)"
}

status() {
  local rc=0 line name check pid mem health
  printf '%-24s %-8s %-8s %s\n' COMPONENT PID MEM_MB HEALTH
  row() {  # row NAME CHECK...
    name=$1; shift
    pid=$(pid_of "$name") || pid=-
    mem=-; [[ $pid != - ]] && mem=$(( $(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0) / 1024 ))
    if "$@" >/dev/null 2>&1; then health=healthy; else health=DOWN; rc=1; fi
    printf '%-24s %-8s %-8s %s\n' "$name" "$pid" "$mem" "$health"
  }
  row containerd containerd_healthy
  row etcd etcd_healthy
  row kube-apiserver apiserver_healthy
  row kube-controller-manager controller_manager_healthy
  row kube-scheduler scheduler_healthy
  row kubelet kubelet_healthy
  row kube-proxy kube_proxy_healthy
  row kube-router kube_router_healthy
  local f
  for f in "${FORWARDS[@]}"; do row "forward-${f%%:*}" forward_healthy "${f%%:*}" "${f#*:}"; done
  row "node/$NODE" node_ready
  row coredns coredns_ready
  row metrics-server metrics_ready
  return $rc
}

# secrets NS: what cert-manager and a secrets manager would write, from the local stack's files.
secrets() {
  local ns=$1 stack_pki="$STACK_DIR/pki" creds="$STACK_DIR/credentials" c
  [[ -f $stack_pki/services.crt && -d $creds ]] || die "secrets: no CA or credentials in $STACK_DIR: run 'stack/stack.sh up' first"
  apply_secret() { kc -n "$ns" create secret generic "$@" --dry-run=client -o yaml | kc apply -f - >/dev/null; }
  apply_secret mailqueue-tls --type kubernetes.io/tls --from-file=tls.crt="$stack_pki/services.crt" \
    --from-file=tls.key="$stack_pki/services.key" --from-file=ca.crt="$stack_pki/ca.crt"
  apply_secret mailqueue-backend-ca --from-file=ca.crt="$stack_pki/ca.crt"
  for c in enqueue dequeue browse blob sweep schema; do
    apply_secret "mailqueue-$c-credentials" --from-file="$creds/$c/"
  done
  say "secrets in $ns: mailqueue-tls, mailqueue-backend-ca, mailqueue-{enqueue,dequeue,browse,blob,sweep,schema}-credentials"
}

case "${1:-}" in
  up) up ;;
  secrets) secrets "${2:?usage: kube.sh secrets NAMESPACE}" ;;
  down) down ;;
  status) status ;;
  env) echo "export KUBECONFIG=$ADMIN_KUBECONFIG" ;;
  import-images) import_images ;;
  check) check ;;
  *) echo "usage: $0 up|down|status|env|import-images|secrets NAMESPACE|check" >&2; exit 2 ;;
esac
