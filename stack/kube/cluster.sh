# `kube.sh up` and `kube.sh down`: the whole start, step by step with its timings, and the stop of
# exactly what up started (state and binaries kept: the next up is warm). Sourced by kube.sh after
# lib.sh and the job files whose steps it calls.

# prepare: what `up` needs that is built or downloaded once per machine, nothing started.
prepare() {
  [[ $(id -u) == 0 ]] || die "the cluster needs root (containerd, iptables, the bridge): run as root"
  mkdir -p "$KDIR" "$RUN" "$LOGS"
  "$HERE/build.sh" >&2 || die "stack/kube/build.sh failed (see above)"
  [[ -x $KUBECTL ]] || die "no kubectl at $KUBECTL (MAILQUEUE_KUBECTL names another)"
  timing "build (cached: $BIN)"
  packages
  timing "packages (apt, once per machine)"
}

up() {
  prepare
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
    # A namespace some process still holds is detached (lazy unmount): its file goes once free.
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    rm -f "$m" 2>/dev/null || say "network namespace $m still busy: left for the system to free"
  done
  [[ -z $(ls -A "$CONTAINERD_TASKS" 2>/dev/null) ]] && rm -rf "${CNI_IPAM_DIR:?}"/*
  iptables_cleanup
  ip route del "$SERVICE_CIDR" dev "$BRIDGE" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  restore_sysctls all
  rm -f "$KDIR/host-sysctls"
  say "cluster stopped in $(since "$start")s (state kept in $KDIR; binaries in $BIN; remove $KDIR for a clean slate)"
}
