#!/usr/bin/env bash
# kuberl end to end on kind: a throwaway cluster, KubeRay and kuberl installed with Helm, the images
# built here with `make images` (the README's command) and loaded into the cluster, then
# examples/tiny-grpo-cluster.yaml run until it Succeeded.
#
#   e2e/run-kind.sh               # needs docker (a running engine), kind, kubectl >= 1.23, helm >= 3.8
#   KEEP_CLUSTER=1 e2e/run-kind.sh  # leave the cluster up afterwards (kind delete cluster --name kuberl-e2e)
#
# kind has no GPUs: the job runs on the CPU runtime image (docker/Dockerfile.runtime-cpu) with the hf
# rollout engine, as tiny-grpo-cluster.yaml asks. Exit code 0 means the RLJob reached phase Succeeded.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=${KIND_CLUSTER:-kuberl-e2e}
KUBERAY_VERSION=${KUBERAY_VERSION:-1.6.0}  # authOptions with a secretName: 1.6+
JOB_TIMEOUT_SECONDS=${JOB_TIMEOUT_SECONDS:-1800}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
RELEASE=kuberl
NAMESPACE=kuberl-system
JOBS=kuberl-e2e
# The names `make images` gives the images by default (hack/images/build.sh): the chart's and the example's.
{ read -r OPERATOR_IMAGE; read -r RUNTIME_IMAGE; } < <(IMAGES="operator runtime-cpu" "$REPO/hack/images/build.sh" names)
RUNTIME_TAG=${RUNTIME_IMAGE##*:}
# The chart's default: <fullname>.<release namespace>.kuberl.io
WEBHOOK=$RELEASE.$NAMESPACE.kuberl.io

log() { printf '\n== %s\n' "$*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "run-kind.sh: $1 is not installed ($2)" >&2; exit 2; }
}

# shellcheck disable=SC2317  # run from the EXIT trap (finish)
diagnose() {
  log "diagnostics"
  kubectl -n "$JOBS" get rljobs,rayjobs,rayclusters,pods -o wide || true
  kubectl -n "$JOBS" get rljob tiny-grpo -o yaml || true
  kubectl -n "$JOBS" get events --sort-by=.lastTimestamp | tail -40 || true
  kubectl -n "$NAMESPACE" logs "deployment/$RELEASE" --tail=200 || true
  kubectl -n "$JOBS" logs -l kuberl.io/role=head --tail=200 --all-containers || true
}

# shellcheck disable=SC2317  # the EXIT trap
finish() {
  local status=$?
  if [[ $status -ne 0 ]]; then
    diagnose
  fi
  if [[ $KEEP_CLUSTER == 1 ]]; then
    log "cluster $CLUSTER kept (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" || true
  fi
  exit "$status"
}

need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need helm "https://helm.sh/docs/intro/install/"
docker info >/dev/null 2>&1 || { echo "run-kind.sh: no Docker engine answers (docker info failed)" >&2; exit 2; }

log "kind cluster $CLUSTER"
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 180s
fi
trap finish EXIT
kubectl config use-context "kind-$CLUSTER"

log "images $OPERATOR_IMAGE and $RUNTIME_IMAGE"
make -C "$REPO" images IMAGES="operator runtime-cpu" CONTAINER_ENGINE=docker
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$RUNTIME_IMAGE"

log "KubeRay $KUBERAY_VERSION"
helm repo add kuberay https://ray-project.github.io/kuberay-helm/ --force-update >/dev/null
helm upgrade --install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
  --namespace kuberay-system --create-namespace --wait --timeout 5m

log "kuberl (chart $REPO/charts/kuberl)"
kubectl create namespace "$JOBS" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install "$RELEASE" "$REPO/charts/kuberl" --namespace "$NAMESPACE" --create-namespace \
  --set kuberay.namespace=kuberay-system \
  --set runtime.image.tag="$RUNTIME_TAG" \
  --set operator.head.memory=2Gi \
  --wait --timeout 5m

log "waiting for the webhook $WEBHOOK (templated by the chart) to answer"
for _ in $(seq 60); do
  if [[ -n $(kubectl get validatingwebhookconfiguration "$WEBHOOK" -o jsonpath='{.webhooks[0].name}' 2>/dev/null) ]]; then
    break
  fi
  sleep 2
done
kubectl get validatingwebhookconfiguration "$WEBHOOK" -o jsonpath='{.webhooks[0].name}{"\n"}'

log "the webhook refuses an invalid RLJob, and one whose checkpoints would stay on the head's disk"
if sed 's/name: grpo/name: ppo/' "$REPO/examples/tiny-grpo-cluster.yaml" | kubectl -n "$JOBS" apply --dry-run=server -f - 2>/dev/null; then
  echo "run-kind.sh: an RLJob asking for ppo without a critic was admitted" >&2
  exit 1
fi
if kubectl -n "$JOBS" apply --dry-run=server -f "$REPO/examples/tiny-grpo.yaml" 2>/dev/null; then
  echo "run-kind.sh: an RLJob without a checkpoint claim or object store was admitted" >&2
  exit 1
fi

log "examples/tiny-grpo-cluster.yaml, checkpointing to examples/k8s/tiny-grpo-checkpoints.yaml"
# kind's storage (local-path) offers ReadWriteOnce only; its one node runs every pod, which is all RWX buys here.
sed 's/ReadWriteMany/ReadWriteOnce/' "$REPO/examples/k8s/tiny-grpo-checkpoints.yaml" | kubectl -n "$JOBS" apply -f -
# The CPU runtime image carries the example's data at /opt/kuberl/examples/data.
sed "s#image: .*#image: $RUNTIME_IMAGE#" "$REPO/examples/tiny-grpo-cluster.yaml" | kubectl -n "$JOBS" apply -f -

deadline=$((SECONDS + JOB_TIMEOUT_SECONDS))
phase=""
while ((SECONDS < deadline)); do
  phase=$(kubectl -n "$JOBS" get rljob tiny-grpo -o jsonpath='{.status.phase}' 2>/dev/null || true)
  step=$(kubectl -n "$JOBS" get rljob tiny-grpo -o jsonpath='{.status.progress.step}/{.status.progress.totalSteps}' 2>/dev/null || true)
  printf '%s phase=%s step=%s\n' "$(date +%T)" "${phase:-none}" "${step:-?}"
  case $phase in
    Succeeded) log "tiny-grpo Succeeded"; exit 0 ;;
    Failed) echo "run-kind.sh: tiny-grpo Failed" >&2; exit 1 ;;
  esac
  sleep 15
done
echo "run-kind.sh: tiny-grpo still ${phase:-without a phase} after ${JOB_TIMEOUT_SECONDS}s" >&2
exit 1
