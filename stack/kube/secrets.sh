# `kube.sh secrets NS`: what cert-manager and a secrets manager would write, from the local stack's
# files (stack/stack.sh up: .stack/pki, .stack/credentials). Applied again, they are updated in place.
# Sourced by kube.sh after lib.sh.

secrets() {
  local ns=$1 stack_pki="$STACK_DIR/pki" creds="$STACK_DIR/credentials" c
  [[ -f $stack_pki/services.crt && -d $creds ]] || die "secrets: no CA or credentials in $STACK_DIR: run 'stack/stack.sh up' first"
  apply_secret() { kc -n "$ns" create secret generic "$@" --dry-run=client -o yaml | kc apply -f - >/dev/null; }
  apply_secret mailqueue-tls --type kubernetes.io/tls --from-file=tls.crt="$stack_pki/services.crt" \
    --from-file=tls.key="$stack_pki/services.key" --from-file=ca.crt="$stack_pki/ca.crt"
  apply_secret mailqueue-backend-ca --from-file=ca.crt="$stack_pki/ca.crt"
  for c in enqueue dequeue browse blob webhook sweep schema; do
    apply_secret "mailqueue-$c-credentials" --from-file="$creds/$c/"
  done
  say "secrets in $ns: mailqueue-tls, mailqueue-backend-ca, mailqueue-{enqueue,dequeue,browse,blob,webhook,sweep,schema}-credentials"
}
