# The cluster's images, without a registry: the pause, CoreDNS, metrics-server and nettest images made
# here from static binaries (FROM scratch), and the project's images of `make image` copied from podman
# into containerd. Sourced by kube.sh after lib.sh.

# Bump when the recipe of the locally made images changes: they are imported again.
IMAGE_RECIPE=1

# make_image REF ENTRYPOINT_JSON SRC:DEST...: a FROM-scratch image of static binaries, written as a
# docker-archive (what `podman save --format docker-archive` writes) and imported into containerd.
# Skipped when containerd has REF made from the same files.
make_image() {
  local ref=$1 entry=$2 pair src dst sum work diff cfg; shift 2
  sum=$({ echo "$IMAGE_RECIPE $ref $entry"; for pair; do stat -L -c '%n %s %Y' "${pair%%:*}"; done; } | sha256sum | cut -c1-16)
  local mark="$KDIR/images/${ref//[\/:]/_}.sum"
  if [[ $(cat "$mark" 2>/dev/null) == "$sum" ]] && has_image "$ref"; then return 0; fi
  mkdir -p "$KDIR/images"
  work=$(mktemp -d "$KDIR/images/build.XXXX")
  mkdir -p "$work/rootfs/etc" "$work/rootfs/tmp"
  chmod 1777 "$work/rootfs/tmp"
  printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/:/nonexistent\n' >"$work/rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$work/rootfs/etc/group"
  for pair; do
    src=${pair%%:*}; dst=${pair#*:}
    install -D -m 0755 "$src" "$work/rootfs$dst"
  done
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" .
  diff=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir "$work/$diff"; mv "$work/layer.tar" "$work/$diff/layer.tar"
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":%s,"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"stack/kube/kube.sh make_image"}]}' \
    "$entry" "$diff" >"$work/config.json"
  cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/$cfg.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$ref" "$diff" >"$work/manifest.json"
  tar -C "$work" -cf "$work/image.tar" manifest.json "$cfg.json" "$diff/layer.tar"
  ctr_ images import "$work/image.tar" >/dev/null 2>"$work/import.err" \
    || die "importing $ref into containerd failed: $(cat "$work/import.err")"
  ctr_ images label "$ref" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
  rm -rf "$work"
  echo "$sum" >"$mark"
  say "image $ref imported into containerd"
}

local_images() {
  local catatonit; catatonit=$(command -v catatonit)
  file -L "$catatonit" | grep -Eq 'statically linked|static-pie linked' || die "$catatonit is not statically linked: the pause image needs a static catatonit"
  make_image "$PAUSE_IMAGE" '["/catatonit","-P"]' "$catatonit:/catatonit"
  make_image "$COREDNS_IMAGE" '["/coredns"]' "$BIN/coredns:/coredns"
  make_image "$METRICS_SERVER_IMAGE" '["/metrics-server"]' "$BIN/metrics-server:/metrics-server"
  make_image "$NETTEST_IMAGE" '["/nettest"]' "$BIN/nettest:/nettest"
}

# import-images: podman's project images into containerd, again only when podman's image id changed.
import_images() {
  local img id mark tmp
  if ! command -v podman >/dev/null; then say "import-images: podman is not installed: no project images to import (stack/image.sh build)"; return 0; fi
  pid_of containerd >/dev/null || die "import-images: containerd is not running: run 'stack/kube/kube.sh up' first"
  mkdir -p "$KDIR/images"
  for img in mailqueue:latest mailqueue-sweep:latest; do
    id=$(podman image inspect --format '{{.Id}}' "$img" 2>/dev/null) || { say "import-images: podman has no $img (stack/image.sh build makes it): skipped"; continue; }
    mark="$KDIR/images/${img//:/_}.podman-id"
    if [[ $(cat "$mark" 2>/dev/null) == "$id" ]] && has_image "docker.io/library/$img"; then
      say "import-images: $img unchanged (podman id ${id:0:12}): skipped"; continue
    fi
    local start=$EPOCHREALTIME
    tmp=$(mktemp "$KDIR/images/save.XXXX")
    podman save --format docker-archive -o "$tmp.tar" "$img" >/dev/null 2>"$tmp.err" || { cat "$tmp.err" >&2; rm -f "$tmp"*; die "podman save $img failed"; }
    # podman names it localhost/NAME:TAG; pods may write NAME:TAG, which the CRI reads as docker.io/library/NAME:TAG.
    ctr_ images import "$tmp.tar" >/dev/null 2>"$tmp.err" || { cat "$tmp.err" >&2; rm -f "$tmp"*; die "ctr import of $img failed"; }
    rm -f "$tmp"*
    ctr_ images tag --force "localhost/$img" "docker.io/library/$img" >/dev/null
    ctr_ images label "localhost/$img" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
    ctr_ images label "docker.io/library/$img" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
    echo "$id" >"$mark"
    say "import-images: $img (podman id ${id:0:12}) imported as $img and localhost/$img in $(since "$start")s"
  done
}
