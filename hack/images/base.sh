#!/usr/bin/env bash
# hack/images/base.sh — build (once) and cache a Python 3.11 base image for kuberl's images where
# Docker Hub's python:3.11-slim-bookworm cannot be pulled (`make test-images` on a machine that
# reaches only Debian's mirror and PyPI).
#
#   IMAGE=$(hack/images/base.sh | tail -n1)     # then: make images PYTHON_IMAGE=$IMAGE
#
# What python:3.11-slim-bookworm gives the Dockerfiles, from Debian bookworm itself (debootstrap,
# variant minbase): python3 3.11 as `python`, pip as `pip`, ca-certificates, and groupadd/useradd.
# Debian marks its Python EXTERNALLY-MANAGED (PEP 668); the marker is removed, so `pip install` goes
# into /usr/local as in the python image. No CA of this machine goes in: a build behind a
# TLS-inspecting proxy passes its bundle with `make images CA_BUNDLE=...`, which never lands in a layer.
#
# Result: the image `localhost/kuberl-python:<key>` in the engine `make images` builds with (docker or
# podman: hack/images/build.sh engine), imported from the root filesystem cached at
# ${KUBERL_IMAGES_CACHE:-$HOME/.cache/kuberl/images}/<key>/rootfs.tar. Its name is printed as the LAST
# line of stdout; progress goes to stderr. Idempotent: with the image present it prints the name at
# once; with only the tarball cached it imports it (seconds). Concurrent runs wait on a flock.
#
# Needs root (debootstrap mounts /proc in the new root) and, if missing, installs debootstrap with apt.
# Build time on a 2-core machine: ~2 minutes; the tarball takes ~170 MB.
set -euo pipefail

SUITE="bookworm"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-pip,python-is-python3,ca-certificates"
RECIPE_ID="1"                                   # bump when what goes into the root below changes
KEY="${SUITE}-py311-r${RECIPE_ID}"
IMAGE="localhost/kuberl-python:${KEY}"
CACHE_ROOT="${KUBERL_IMAGES_CACHE:-$HOME/.cache/kuberl/images}"
DIR="${CACHE_ROOT}/${KEY}"
ENGINE=$("$(dirname "${BASH_SOURCE[0]}")/build.sh" engine)  # the engine `make images` builds with

log() { printf '[images-base %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

image_present() { $ENGINE image inspect "$IMAGE" >/dev/null 2>&1; }

import_image() {
  log "importing $DIR/rootfs.tar as $IMAGE"
  # The python image's defaults that the Dockerfiles lean on: a UTF-8 locale and python as the command.
  $ENGINE import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$DIR/rootfs.tar" "$IMAGE" >&2
}

if image_present; then
  echo "$IMAGE"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"${CACHE_ROOT}/.${KEY}.lock"
log "waiting for the lock ${CACHE_ROOT}/.${KEY}.lock"
flock 9
if image_present; then
  echo "$IMAGE"
  exit 0
fi
if [[ -s "$DIR/rootfs.tar" ]]; then
  import_image
  echo "$IMAGE"
  exit 0
fi

[[ $(id -u) == 0 ]] || die "debootstrap needs root; or build on a machine that pulls python:3.11-slim-bookworm"
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >&2
fi

START_TS=$(date +%s)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kuberl-images-base.XXXXXX")"
cleanup() {
  # debootstrap mounts /proc and /sys in the new root; unmount before removing anything.
  for mounted in proc sys; do umount "$WORK/root/$mounted" 2>/dev/null || true; done
  rm -rf "$WORK" "${DIR}.tmp"
}
trap cleanup EXIT

log "debootstrap $SUITE ($PACKAGES) from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$WORK/root" "$MIRROR" >&2

# pip may install outside a virtual environment, as in Docker Hub's python image (PEP 668's marker).
rm -f "$WORK"/root/usr/lib/python3*/EXTERNALLY-MANAGED
# What an image does not need: apt's lists and caches, documentation.
rm -rf "$WORK"/root/var/lib/apt/lists/* "$WORK"/root/var/cache/apt/*.bin "$WORK"/root/var/cache/apt/archives/*.deb \
  "$WORK"/root/usr/share/doc/* "$WORK"/root/usr/share/man/*
"$WORK/root/usr/bin/python3" --version >&2 2>&1 || true

rm -rf "${DIR}.tmp" && mkdir -p "${DIR}.tmp"
tar --numeric-owner --exclude=./proc/* --exclude=./sys/* --exclude=./dev/* -C "$WORK/root" -cf "${DIR}.tmp/rootfs.tar" .
{
  echo "key: $KEY"
  echo "debootstrap --variant=minbase --include=$PACKAGES $SUITE $MIRROR"
  echo "python: $(chroot "$WORK/root" python3 --version 2>&1)"
  echo "pip: $(chroot "$WORK/root" pip --version 2>&1)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - START_TS))s"
} >"${DIR}.tmp/BUILD-INFO.txt"
rm -rf "$DIR" && mv -T "${DIR}.tmp" "$DIR"
sed 's/^/    /' "$DIR/BUILD-INFO.txt" >&2
import_image
log "done in $(($(date +%s) - START_TS))s"
echo "$IMAGE"
