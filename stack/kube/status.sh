# Health of every component, as `up` waits for it and `status` prints it. Sourced by kube.sh after lib.sh.

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
