#!/usr/bin/env bash
# hack/images/ensure-engine.sh — install Debian's podman (with runc) where no container engine is there yet:
# what a fresh CI machine needs before `make test-images` (.ci/run). Does nothing where docker's engine
# answers or podman is installed. Needs root and apt (retries after `apt-get update` on empty package lists).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if "$REPO/hack/images/build.sh" engine >/dev/null 2>&1; then
  exit 0
fi
echo "hack/images/ensure-engine.sh: no container engine; installing podman and runc" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y podman runc >&2 || { apt-get update >&2 && apt-get install -y podman runc >&2; }
