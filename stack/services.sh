#!/usr/bin/env bash
# Start, stop or show the services (the four and webhook_svc) as local background processes (logs under .stack/logs).
#   stack/services.sh start | stop | status
# They serve gRPC over TLS (the local CA's certificate, stack/pki.sh) and reach the backends over
# TLS, each with its own credential. A client trusts .stack/pki/ca.crt:
#   mailq --tls-ca .stack/pki/ca.crt ...   or   export MAILQ_TLS_CA=.stack/pki/ca.crt
# The work is stack/services.py (python -m stack.services), on stack/harness.py: the same service
# processes, health checks and stopping that the tests and the benches use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${MAILQUEUE_PYTHON:-$ROOT/.venv/bin/python}"

case "${1:-}" in
  start|stop|status) cd "$ROOT" && exec "$PY" -m stack.services "$1" ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
