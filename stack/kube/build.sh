#!/usr/bin/env bash
# Build the cluster's Go parts once per machine into $MAILQUEUE_CACHE_DIR (default
# ~/.cache/mailqueue-stack): hyperkube (kube-apiserver, -controller-manager, -scheduler, kubelet,
# kube-proxy and kubectl as symlinks to one binary, version stamped), CoreDNS, metrics-server, crictl and
# kube-router (the NetworkPolicy controller), and nettest (./nettest, the probe `kube.sh check` runs in
# pods). Everything comes from the Go module proxy.
# Cold: about 7 minutes on 2 cores (hyperkube is most of it); cached: nothing is rebuilt.
set -euo pipefail
# The versions, $BIN and say: lib.sh.
# shellcheck source=stack/kube/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

export CGO_ENABLED=0 GOFLAGS=-trimpath
mkdir -p "$BIN"

# Rebuilt when its source changes (a component added: kubectl).
if [[ ! -x "$BIN/hyperkube" || "$HERE/hyperkube/main.go" -nt "$BIN/hyperkube" || "$HERE/hyperkube/go.mod" -nt "$BIN/hyperkube" ]]; then
  say "building hyperkube $KUBE_VERSION from the Go module proxy (once per machine; about 7 minutes on 2 cores)"
  stamp=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=34"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$HERE/hyperkube" && nice go build -ldflags "-s -w $stamp" -o "$BIN/hyperkube.tmp" .)
  mv "$BIN/hyperkube.tmp" "$BIN/hyperkube"
fi
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  ln -sfn hyperkube "$BIN/$c"
done

# go_tool NAME MODULE@VERSION: go install into the cache once.
go_tool() {
  local name=$1 mod=$2
  [[ -x "$BIN/$name" ]] && return 0
  say "building $name ($mod) with go install (once per machine)"
  GOBIN="$BIN" nice go install -ldflags "-s -w" "$mod"
}
go_tool coredns "github.com/coredns/coredns@v$COREDNS_VERSION"
go_tool metrics-server "sigs.k8s.io/metrics-server/cmd/metrics-server@v$METRICS_SERVER_VERSION"
go_tool crictl "sigs.k8s.io/cri-tools/cmd/crictl@v$CRICTL_VERSION"
go_tool kube-router "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v$KUBE_ROUTER_VERSION"
# nettest: standard library only, a few seconds; rebuilt when its source changes.
if [[ ! -x "$BIN/nettest" || "$HERE/nettest/main.go" -nt "$BIN/nettest" ]]; then
  (cd "$HERE/nettest" && go build -ldflags "-s -w" -o "$BIN/nettest" .)
fi
