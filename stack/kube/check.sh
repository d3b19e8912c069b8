# `kube.sh check`: a throwaway end-to-end test of the running cluster in its own namespace, from pods
# (stack/kube/manifests/check*: nettest pods, a Service, a NetworkPolicy, a pod of the project's image).
# Sourced by kube.sh after lib.sh and status.sh.

# The namespace of the check's manifests (their kustomizations' `namespace:`), removed at the end.
CHECK_NS=mailqueue-kube-check
# in_pod POD ARGS...: run nettest ARGS in a check pod.
in_pod() { local pod=$1; shift; kc -n "$CHECK_NS" exec "$pod" -- /nettest "$@"; }

check() {
  node_ready || die "the cluster is not up: run 'stack/kube/kube.sh up' first"
  local start=$EPOCHREALTIME failures=0 out svc_ip t f
  ok() { say "check OK:     $*"; }
  bad() { say "check FAILED: $*"; failures=$((failures + 1)); }
  kc delete namespace "$CHECK_NS" --ignore-not-found --wait=true >/dev/null
  trap 'kc delete namespace "$CHECK_NS" --wait=false >/dev/null 2>&1 || true' EXIT
  stage_manifests
  kc apply -k "$MANIFESTS/check" >/dev/null
  kc -n "$CHECK_NS" wait --for=condition=Ready pod --all --timeout=60s >/dev/null \
    || die "check pods not Ready within 60s: kubectl -n $CHECK_NS describe pods"
  ok "3 pods Ready in $(since "$start")s"
  svc_ip=$(kc -n "$CHECK_NS" get svc server -o jsonpath='{.spec.clusterIP}')
  # CoreDNS learns the new Service from its watch: poll (run again 2 minutes later on a loaded machine,
  # it answered the previous run's address right after the pods were Ready).
  resolves_server() { out=$(in_pod allowed resolve "server.$CHECK_NS.svc.cluster.local" 2>&1) && [[ $out == "$svc_ip" ]]; }
  if poll 15 resolves_server; then
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
  kc apply -k "$MANIFESTS/check-policy" >/dev/null
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
  if has_image docker.io/library/mailqueue:latest; then
    kc apply -k "$MANIFESTS/check-python" >/dev/null
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
