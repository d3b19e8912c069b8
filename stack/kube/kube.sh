#!/usr/bin/env bash
# A real single-node Kubernetes (v1.34) on this machine: plain background processes, no registry.
#
#   stack/kube/kube.sh install        build the binaries and install the packages (once per machine), start nothing
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
# By job, each file sourced here after the common lib.sh (versions, addresses, paths, waiting, PID files,
# templates and manifests): host.sh (packages, bridge, sysctls, iptables), config.sh (certificates,
# kubeconfigs, the components' files from templates/), images.sh, components.sh (the daemons, the add-ons
# of manifests/addons with `kubectl apply -k`), status.sh (health), cluster.sh (up, down), check.sh
# (manifests/check*), secrets.sh. build.sh builds the binaries (Go module proxy).
set -euo pipefail
set +m

# shellcheck source=stack/kube/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
for part in host config images status components cluster check secrets; do
  # shellcheck source=/dev/null
  source "$HERE/$part.sh"
done

case "${1:-}" in
  install) prepare ;;
  up) up ;;
  secrets) secrets "${2:?usage: kube.sh secrets NAMESPACE}" ;;
  down) down ;;
  status) status ;;
  env) printf 'export KUBECONFIG=%q MAILQUEUE_KUBECTL=%q PATH=%q:"$PATH"\n' "$ADMIN_KUBECONFIG" "$KUBECTL" "$(dirname "$KUBECTL")" ;;
  import-images) import_images ;;
  check) check ;;
  *) echo "usage: $0 install|up|down|status|env|import-images|secrets NAMESPACE|check" >&2; exit 2 ;;
esac
