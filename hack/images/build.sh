#!/usr/bin/env bash
# hack/images/build.sh — kuberl's images with docker or podman: what `make images`, `make push` and
# `make image-names` run (the Makefile passes its variables as the environment below).
#
#   hack/images/build.sh build    # build IMAGES
#   hack/images/build.sh push     # push IMAGES (after `docker login` / `podman login` to the registry)
#   hack/images/build.sh names    # print each image's name, one a line
#   hack/images/build.sh engine   # print the engine it uses (tests/integration/images runs the images with it)
#
# IMAGES lists which (default: operator runtime-cpu); each is docker/Dockerfile.<image>, named
#   operator     -> $IMAGE_REGISTRY/operator:$IMAGE_TAG
#   runtime-cpu  -> $IMAGE_REGISTRY/runtime:$IMAGE_TAG-cpu   (torch's CPU build, no vLLM: kind, CPU clusters)
#   runtime      -> $IMAGE_REGISTRY/runtime:$IMAGE_TAG       (the GPU image on vllm/vllm-openai: the chart's default)
# IMAGE_REGISTRY defaults to ghcr.io/kuberl and IMAGE_TAG to the version in pyproject.toml, which is the
# chart's appVersion: the names the chart and examples/tiny-grpo-cluster.yaml use.
#
# Build arguments, each optional:
#   PYTHON_IMAGE     the base of the operator and CPU runtime images (python:3.11-slim-bookworm)
#   TORCH_INDEX_URL  where the CPU runtime image's torch comes from (PyTorch's CPU index) ...
#   TORCH_WHEELS     ... or a folder holding torch's CPU wheel (passed as the build context `torch-wheels`)
#   CA_BUNDLE        a PEM bundle pip trusts while it builds, for builds behind a TLS-inspecting proxy: passed
#                    as a build secret, so it never lands in a layer
# CONTAINER_ENGINE picks the engine; by default docker when a docker engine answers, else podman.
# Docker needs BuildKit (the default builder since Docker 23) for the secret and the build context.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGES=${IMAGES:-operator runtime-cpu}
IMAGE_REGISTRY=${IMAGE_REGISTRY:-ghcr.io/kuberl}
IMAGE_TAG=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml")}

die() { echo "hack/images/build.sh: $*" >&2; exit 2; }

# The engine: CONTAINER_ENGINE, else docker if its engine answers (a docker CLI may be there without one), else podman.
container_engine() {
  if [[ -n ${CONTAINER_ENGINE:-} ]]; then
    echo "$CONTAINER_ENGINE"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  else
    die "neither a docker engine (docker info failed) nor podman was found: install one (Debian: apt-get install podman)"
  fi
}

image_name() {
  case $1 in
    operator) echo "$IMAGE_REGISTRY/operator:$IMAGE_TAG" ;;
    runtime-cpu) echo "$IMAGE_REGISTRY/runtime:$IMAGE_TAG-cpu" ;;
    runtime) echo "$IMAGE_REGISTRY/runtime:$IMAGE_TAG" ;;
    *) die "unknown image '$1' in IMAGES (known: operator runtime-cpu runtime)" ;;
  esac
}

# BUILD_OPTIONS: the build's arguments that the caller set (the Dockerfiles' defaults stand for the others).
set_build_options() {
  BUILD_OPTIONS=()
  if [[ -n ${PYTHON_IMAGE:-} ]]; then BUILD_OPTIONS+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE"); fi
  if [[ -n ${TORCH_INDEX_URL:-} ]]; then BUILD_OPTIONS+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"); fi
  if [[ -n ${TORCH_WHEELS:-} ]]; then
    compgen -G "$TORCH_WHEELS/torch-*.whl" >/dev/null || die "TORCH_WHEELS=$TORCH_WHEELS holds no torch-*.whl"
    BUILD_OPTIONS+=(--build-context "torch-wheels=$(cd "$TORCH_WHEELS" && pwd)")
  fi
  if [[ -n ${CA_BUNDLE:-} ]]; then
    [[ -s $CA_BUNDLE ]] || die "CA_BUNDLE=$CA_BUNDLE is not a readable, non-empty file"
    BUILD_OPTIONS+=(--secret "id=ca-bundle,src=$CA_BUNDLE" --build-arg PIP_CERT=/run/secrets/ca-bundle)
  fi
}

build() {
  local engine image
  set_build_options
  engine=$(container_engine)
  for image in $IMAGES; do
    echo "== $(image_name "$image") (docker/Dockerfile.$image, $engine)" >&2
    $engine build "${BUILD_OPTIONS[@]}" -f "$REPO/docker/Dockerfile.$image" -t "$(image_name "$image")" "$REPO"
  done
}

push() {
  local engine image
  engine=$(container_engine)
  for image in $IMAGES; do
    $engine push "$(image_name "$image")"
  done
}

for image in $IMAGES; do image_name "$image" >/dev/null; done  # an unknown name stops here, before any build
case ${1:-} in
  build) build ;;
  push) push ;;
  names) for image in $IMAGES; do image_name "$image"; done ;;
  engine) container_engine ;;
  *) die "usage: hack/images/build.sh build|push|names|engine" ;;
esac
