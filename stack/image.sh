#!/usr/bin/env bash
# The container images, built with podman on this machine (no Docker engine, no registry).
#
#   stack/image.sh engine   podman and mmdebstrap from apt, and the two host settings crun needs here
#                           (the cgroup hugetlb controller on a v1 hierarchy, ulimits within the hard limits)
#   stack/image.sh bases    stand-ins for the base images the Dockerfile names (python:3.11-slim,
#                           maven:3.9-eclipse-temurin-17), built from Debian's packages with mmdebstrap
#                           and tagged with those names; skipped when podman already has them
#   stack/image.sh build    engine + bases, then `podman build` of the Dockerfile, unchanged, for its two
#                           targets: mailqueue:latest (services) and mailqueue-sweep:latest (sweep)
#   stack/image.sh sizes    one line per image: name, size
#
# No registry is reachable, so nothing is pulled (--pull=never): where a real registry is, the
# Dockerfile builds the same way from the real base images (`podman build --target services .`).
# The stand-ins trust the host's local CAs (/usr/local/share/ca-certificates): pip and Maven inside
# the build reach PyPI and Maven Central through this machine's egress like the host does.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${MAILQUEUE_STACK_DIR:-$ROOT/.stack}/image"
IMAGE="${MAILQUEUE_IMAGE:-mailqueue:latest}"
SWEEP_IMAGE="${MAILQUEUE_SWEEP_IMAGE:-mailqueue-sweep:latest}"
PYTHON_BASE=docker.io/library/python:3.11-slim
MAVEN_BASE=docker.io/library/maven:3.9-eclipse-temurin-17
SUITE=bookworm
MIRROR="${MAILQUEUE_DEBIAN_MIRROR:-http://deb.debian.org}"
# Bump when the stand-in recipe changes: an image with another revision is rebuilt.
STAND_IN_REVISION=1

say() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }

engine() {
  if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null; then
    [[ $(id -u) == 0 ]] || die "podman and mmdebstrap are installed with apt-get: run as root (or install them)"
    say "installing podman and mmdebstrap from Debian (apt-get, about 30 s)"
    mkdir -p "$WORK"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman mmdebstrap; } \
      >"$WORK/apt.log" 2>&1 || die "apt-get install podman mmdebstrap failed; see $WORK/apt.log"
  fi
  # crun refuses a hybrid cgroup layout that leaves a controller on the v2 hierarchy: on a v1 host
  # (/sys/fs/cgroup a tmpfs of v1 mounts) without a hugetlb mount, give hugetlb its own v1 hierarchy.
  if [[ $(stat -f -c %T /sys/fs/cgroup) == tmpfs ]] && grep -q '^hugetlb' /proc/cgroups \
      && ! mountpoint -q /sys/fs/cgroup/hugetlb; then
    say "mounting the cgroup v1 hugetlb controller (crun needs every controller on one hierarchy kind)"
    mkdir -p /sys/fs/cgroup/hugetlb
    mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
  fi
  # crun cannot raise ulimits above the hard limits podman itself runs with (podman's defaults ask
  # more than this machine allows). nproc: 4096 per uid is plenty for these services (seen here:
  # 16384 worked, 65536 was refused though the shell's hard limit was 96364).
  if ! grep -qs default_ulimits /etc/containers/containers.conf; then
    local nofile nproc
    nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
    [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
    [[ $nproc == unlimited || $nproc -gt 4096 ]] && nproc=4096
    say "writing /etc/containers/containers.conf: ulimits nofile=$nofile nproc=$nproc (within the hard limits here)"
    mkdir -p /etc/containers
    printf '# Written by mailqueue stack/image.sh: ulimits within the hard limits of this machine.\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
      "$nofile" "$nofile" "$nproc" "$nproc" >>/etc/containers/containers.conf
  fi
}

# stand_in NAME PACKAGES CMD: a Debian $SUITE root file system with PACKAGES, imported as NAME.
stand_in() {
  local name=$1 packages=$2 cmd=$3 tar
  if podman image exists "$name"; then
    local revision
    revision=$(podman image inspect --format '{{index .Labels "io.mailqueue.stand-in"}}' "$name")
    [[ $revision == "$STAND_IN_REVISION" ]] && return
    # No label: the real image (pulled from a registry where there is one): keep it.
    [[ -z $revision || $revision == "<no value>" ]] && return
    say "$name: a stand-in of revision $revision, rebuilding as revision $STAND_IN_REVISION"
  fi
  mkdir -p "$WORK"
  tar="$WORK/$(echo "$name" | tr '/:' '__').tar"
  say "building a stand-in for $name from Debian $SUITE packages ($packages)"
  local start=$SECONDS
  # The official images have no PEP 668 marker (pip installs into the system Python) and trust
  # the usual CAs; these trust the host's local CAs too, and keep apt's lists out of the layer.
  if ! mmdebstrap --variant=minbase --mode=root \
      --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='APT::Install-Recommends "false"' \
      --include="$packages" \
      --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
      --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/ 2>/dev/null || true' \
      --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1 || true' \
      --customize-hook='chroot "$1" sh -c "[ ! -x /etc/ca-certificates/update.d/jks-keystore ] || /etc/ca-certificates/update.d/jks-keystore >/dev/null 2>&1 || true"' \
      "$SUITE" "$tar" \
      "deb $MIRROR/debian $SUITE main" "deb $MIRROR/debian $SUITE-updates main" \
      "deb $MIRROR/debian-security $SUITE-security main" >"$tar.log" 2>&1; then
    die "mmdebstrap failed for $name; see $tar.log"
  fi
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change "CMD $cmd" \
    --change "LABEL io.mailqueue.stand-in=$STAND_IN_REVISION" "$tar" "$name" >/dev/null
  rm -f "$tar"
  say "$name: stand-in ready in $((SECONDS - start)) s"
}

bases() {
  stand_in "$PYTHON_BASE" python3,python3-pip,python-is-python3,ca-certificates,passwd '["python3"]'
  stand_in "$MAVEN_BASE" maven,openjdk-17-jdk-headless,ca-certificates,ca-certificates-java '["mvn"]'
}

build() {
  engine
  bases
  mkdir -p "$WORK"
  local target tag start
  for target in services sweep; do
    tag=$IMAGE; [[ $target == sweep ]] && tag=$SWEEP_IMAGE
    say "podman build --target $target -t $tag (log: $WORK/build-$target.log)"
    start=$SECONDS
    if ! podman build --pull=never --target "$target" -t "$tag" -f "$ROOT/Dockerfile" "$ROOT" \
        >"$WORK/build-$target.log" 2>&1; then
      tail -20 "$WORK/build-$target.log" >&2
      die "podman build --target $target failed; see $WORK/build-$target.log"
    fi
    say "$tag built in $((SECONDS - start)) s"
  done
  sizes
}

sizes() {
  local name
  for name in "$IMAGE" "$SWEEP_IMAGE"; do
    podman image exists "$name" || { echo "$name not built"; continue; }
    podman image inspect --format "$name {{.Size}}" "$name" | awk '{printf "%s %.0f MB\n", $1, $2 / 1e6}'
  done
}

case "${1:-}" in
  engine) engine ;;
  bases) engine; bases ;;
  build) build ;;
  sizes) sizes ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
