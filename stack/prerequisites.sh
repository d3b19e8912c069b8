#!/usr/bin/env bash
# The tools the project builds and runs with, which no package registry of ours installs: checked
# once, before `make install` creates the venv, so a machine without one is told at once what to
# install (not several minutes later, by the first build that needs it).
#   Python >= 3.11 with venv, Go >= 1.24, a JDK 17 with Maven, Node.js with npm.
# RabbitMQ, openssl and curl come from apt, installed by stack/stack.sh itself (as root).
set -uo pipefail

missing=()
version_at_least() {  # version_at_least HAVE WANT: dotted versions compared part by part
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

if ! command -v python3 >/dev/null; then
  missing+=("Python >= 3.11 with venv (apt-get install python3 python3-venv)")
else
  py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  version_at_least "$py" 3.11 || missing+=("Python >= 3.11 (python3 is $py)")
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=("Python's venv (apt-get install python3-venv)")
fi
if ! command -v go >/dev/null; then
  missing+=("Go >= 1.24 (https://go.dev/dl; Debian 12's golang package is too old)")
else
  gov=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  version_at_least "${gov:-0}" 1.24 || missing+=("Go >= 1.24 (go is ${gov:-unknown})")
fi
java_ok=""
for j in "${MAILQUEUE_JAVA:-}" /usr/lib/jvm/java-17-openjdk-amd64/bin/java /usr/lib/jvm/java-17-openjdk/bin/java "$(command -v java || true)"; do
  if [ -n "$j" ] && [ -x "$j" ]; then java_ok=1; break; fi  # the one stack/backends/cassandra.sh finds
done
[ -n "$java_ok" ] || missing+=("a JDK 17, for Cassandra and Spark (apt-get install openjdk-17-jdk-headless; or MAILQUEUE_JAVA=/path/to/java)")
command -v mvn >/dev/null || missing+=("Maven, to fetch Cassandra's jars from Maven Central (apt-get install maven)")
{ command -v node >/dev/null && command -v npm >/dev/null; } || missing+=("Node.js with npm, for the Node contract client and the docs' diagrams (apt-get install nodejs npm)")

if [ ${#missing[@]} -gt 0 ]; then
  echo "[prerequisites] this machine lacks what the project builds with; install, then run make again:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 1
fi
