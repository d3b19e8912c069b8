#!/usr/bin/env bash
# A local certificate authority and the certificates the suite serves, made with openssl.
#
#   stack/pki.sh [DIR]          make what is missing (idempotent); DIR defaults to .stack/pki
#   stack/pki.sh renew [NAME] [DIR]   issue the leaf certificates (or only NAME: backends, services,
#                               operator) again from the same CA (rotation: services reread theirs
#                               at the next handshake, no restart)
#
# What it makes in DIR (keys 0600):
#   ca.crt, ca.key            the CA (10 years); clients trust ca.crt
#   backends.crt, .key, .pem  Cassandra, RabbitMQ and MinIO (the .pem is key + chain, the PEM
#                             keystore Cassandra reads)
#   services.crt, .key        the four gRPC services (server certificate)
#   operator.crt, .key        a client certificate for mutual TLS (URI SAN spiffe://mailqueue/operator)
# Leaf certificates last 90 days and name every address the suite is reached on: loopback
# (127.0.0.1-3, the clusters' nodes), localhost, and the Kubernetes names of the local overlay.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
renew=false only=""
if [[ ${1:-} == renew ]]; then
  renew=true; shift
  if [[ ${1:-} =~ ^(backends|services|operator)$ ]]; then only=$1; shift; fi
fi
DIR="${1:-${MAILQUEUE_STACK_DIR:-$ROOT/.stack}/pki}"
NS="${MAILQUEUE_KUBE_NAMESPACE:-mailqueue-dev}"
DAYS=90

say() { printf '[pki] %s\n' "$*" >&2; }
command -v openssl >/dev/null || { echo "[pki] ERROR: openssl is needed: apt-get install openssl" >&2; exit 1; }
mkdir -p "$DIR"
chmod 700 "$DIR"
cd "$DIR"
umask 077

names() {  # names SERVICE...: the DNS SANs of Kubernetes Services in the namespace
  local out="" n
  for n in "$@"; do out+=",DNS:$n,DNS:$n.$NS,DNS:$n.$NS.svc,DNS:$n.$NS.svc.cluster.local"; done
  echo "$out"
}

if [[ ! -f ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=mailqueue local CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  say "made the local CA: $DIR/ca.crt"
fi

# leaf NAME CN SANS USAGE: a key and a certificate signed by the CA.
leaf() {
  local name=$1 cn=$2 sans=$3 usage=$4
  [[ -f $name.crt && ( $renew == false || ( -n $only && $only != "$name" ) ) ]] && return
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n' \
    "$sans" "$usage" >"$name.ext"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$name.key.new" -out "$name.csr" -subj "/CN=$cn" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" -extfile "$name.ext" \
    -out "$name.crt.new" 2>/dev/null
  # PKCS#8 keys: every reader (Erlang, Go, Java's PEM keystore, gRPC) takes them.
  openssl pkcs8 -topk8 -nocrypt -in "$name.key.new" -out "$name.key.p8"
  rm -f "$name.key.new" "$name.csr" "$name.ext"
  # Key first, then certificate: a reader that sees a new key with the old certificate fails to
  # load the pair and keeps what it has until the next handshake (services/runtime/tls.py).
  mv "$name.key.p8" "$name.key"
  mv "$name.crt.new" "$name.crt"
  cat "$name.key" "$name.crt" >"$name.pem.new" && mv "$name.pem.new" "$name.pem"
  say "issued $name.crt ($cn, $DAYS days)"
}

LOOPBACK="IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost"
# 10.244.0.1: the Kubernetes node's bridge, where stack/kube/kube.sh forwards to the backends.
leaf backends "mailqueue backends" "$LOOPBACK,IP:10.244.0.1$(names cassandra rabbitmq minio)" serverAuth
leaf services "mailqueue services" \
  "$LOOPBACK$(names mailqueue-enqueue mailqueue-dequeue mailqueue-browse mailqueue-blob)" serverAuth,clientAuth
leaf operator "operator" "URI:spiffe://mailqueue/operator" clientAuth
chmod 644 ca.crt ./*.crt
