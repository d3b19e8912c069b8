# What the components read: the cluster's certificates (openssl, made once), the kubeconfigs, and the
# configuration files of containerd, the CNI bridge, the kubelet and kube-proxy, rendered from
# stack/kube/templates/ (written only when their text changes: a daemon restarts when its file does).
# Sourced by kube.sh after lib.sh.

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
  local file="$KDIR/$1.kubeconfig" tmp KUBE_USER=$2 CA_DATA CERT_DATA KEY_DATA
  CA_DATA=$(base64 -w0 "$PKI/ca.crt"); CERT_DATA=$(base64 -w0 "$PKI/$1.crt"); KEY_DATA=$(base64 -w0 "$PKI/$1.key")
  tmp=$(umask 077; mktemp "$file.XXXX")
  render kubeconfig.in >"$tmp"
  if cmp -s "$tmp" "$file"; then rm -f "$tmp"; else mv "$tmp" "$file"; fi
}

configs() {
  mkdir -p "$CONF" "$CNI_CONF_DIR" "$CNI_IPAM_DIR"
  kubeconfig admin mailqueue-admin
  kubeconfig controller-manager system:kube-controller-manager
  kubeconfig scheduler system:kube-scheduler
  kubeconfig kube-proxy system:kube-proxy
  kubeconfig kubelet "system:node:$NODE"
  kubeconfig kube-router mailqueue-kube-router
  local RUNC; RUNC=$(command -v runc)
  render_to containerd.toml.in "$CONF/containerd.toml"
  # Pods: one bridge, host-local addresses, routes only to the pod and service ranges (no default
  # route, no masquerading: nothing leaves the machine).
  render_to 10-mailqueue.conflist.in "$CNI_CONF_DIR/10-mailqueue.conflist"
  render_to kubelet.yaml.in "$CONF/kubelet.yaml"
  render_to kube-proxy.yaml.in "$CONF/kube-proxy.yaml"
}
