# The cluster's daemons, started in order (each unless it already runs with the same command line and
# configuration: lib.sh's daemon), and the add-ons of stack/kube/manifests/addons applied on top.
# Sourced by kube.sh after lib.sh.

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
    --use-service-account-credentials=true --profiling=false \
    --horizontal-pod-autoscaler-sync-period=5s
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
# apply_addons: CoreDNS (cluster names only, no forward) and metrics-server (`kubectl top`, the HPA),
# with `kubectl apply -k`, again only when what they are made of changed or one is missing.
apply_addons() {
  stage_manifests
  local sum; sum=$(cd "$MANIFESTS" && find values addons -type f | sort | xargs sha256sum | sha256sum | cut -c1-16)
  if [[ $(cat "$KDIR/addons.applied" 2>/dev/null) == "$sum" ]] \
      && kc -n kube-system get deploy coredns metrics-server >/dev/null 2>&1; then
    return 0
  fi
  kc apply -k "$MANIFESTS/addons" >"$LOGS/addons.log" 2>&1 || die "kubectl apply -k $MANIFESTS/addons failed; see $LOGS/addons.log"
  echo "$sum" >"$KDIR/addons.applied"
  say "add-ons applied: CoreDNS ($DNS_IP), metrics-server (v1beta1.metrics.k8s.io)"
}
