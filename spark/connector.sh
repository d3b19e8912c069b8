#!/usr/bin/env bash
# Fetches the Spark Cassandra Connector and its runtime dependencies from Maven Central, once per
# machine, into ~/.cache/mailqueue-stack/spark-connector-<version> (or $1), and prints the folder.
# The 3.5.x assembly jar is not on Maven Central (see spark/pom.xml), so the plain jars are used.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${MAILQUEUE_SPARK_CONNECTOR_VERSION:-3.5.1}
DEST=${1:-$HOME/.cache/mailqueue-stack/spark-connector-$VERSION}
if compgen -G "$DEST/spark-cassandra-connector_2.12-$VERSION.jar" >/dev/null; then
  echo "$DEST"; exit 0
fi
command -v mvn >/dev/null || { echo "spark: Maven (mvn) is needed to fetch the connector from Maven Central: apt-get install maven" >&2; exit 1; }
echo "spark: fetching spark-cassandra-connector $VERSION and its dependencies from Maven Central (once per machine)" >&2
mkdir -p "$DEST.tmp"
if ! mvn -B -q -f "$ROOT/spark/pom.xml" -Dconnector.version="$VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$DEST.tmp" >&2; then
  echo "spark: Maven download failed (see above)" >&2; exit 1
fi
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
echo "$DEST"
