# The host side of the cluster: the Debian packages (once per machine), the bridge and the service
# route, the sysctls the kubelet rewrites, and the KUBE-* iptables chains left after a stop.
# Sourced by kube.sh after lib.sh.

# The kubelet rewrites these at start: up puts the host's values back once the node is Ready.
KUBELET_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
# It also sets these (to the kernel's defaults, on this kernel): the cluster keeps the kubelet's values
# while it runs (containers' keyrings count against root's key quota); down puts the host's back.
KUBELET_SYSCTLS_RUNNING=(vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
TRIXIE_SOURCE=/etc/apt/sources.list.d/mailqueue-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/mailqueue-trixie

# ---------------------------------------------------------------- packages
# packages: what the cluster runs on, from Debian (apt-get, once per machine; root).
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

# ---------------------------------------------------------------- after a stop
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
