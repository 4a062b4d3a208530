"""What a job needs on a cluster that a local run does not: the checks of the webhook and `kuberl validate --cluster`.

On one machine every worker shares one filesystem; on a cluster each pool is a pod of its own. Two things
follow, and a local run cannot see either:

- Checkpoints need storage every pod shares. Each trainer rank writes its own shards of a checkpoint on its
  own pod and the head commits them; on the head's disk (the default without a claim or an object store)
  the first commit finds no shards, and nothing survives the pods for a restart to resume from. So a job on
  Kubernetes names `checkpoint.pvcClaimName` or an object-store `checkpoint.uri`: `storage_problems`.
- A local path (a model folder, data, a reward file) names a file only on the pods that mount the volume
  holding it. `unreachable_paths` holds every path the spec names (api/reads.py: which pods read it) against
  the volume mounts of the pods the operator builds (builders.py, the user's podTemplates merged in) and the
  files of kuberl's runtime images (contract.IMAGE_FILES_DIR).

The webhook refuses a job with storage problems: no image or template can make it resume. It admits one with
unreachable paths with a warning per path (kubectl prints them): an image of the user's own may carry models
and data anywhere, which no check of the manifest can see; the runtime then stops at start-up naming the field
(runtime/loop/plan.py). `kuberl validate --cluster` reports both as errors, for CI over the manifests one applies
with kuberl's images.

Pure functions of the parsed job; the pods are read from a RayJob built by builders.build_rayjob.
"""

import posixpath
from dataclasses import dataclass
from typing import Any

from kuberl.api import Problem, RLJob, contract
from kuberl.api.reads import local_path, local_reads
from kuberl.api.topology import HEAD_POOL
from kuberl.operator import builders

#: Object stores the runtime checkpoints to (runtime/checkpoint/storage.py, through fsspec).
OBJECT_STORE_SCHEMES = ("s3", "gs")
#: The image a review builds pods with when the job names none: the image holds no mounts, so any name serves.
REVIEW_IMAGE = "kuberl-runtime:review"


@dataclass(frozen=True)
class ClusterReview:
    """What stands between a valid RLJob and a run on a cluster."""

    #: No image or pod template can fix these: the webhook refuses the job.
    refusals: list[Problem]
    #: Paths no pod that reads them mounts (an image of the user's own may still hold them): warnings.
    unreachable: list[Problem]


def review_for_cluster(job: RLJob) -> ClusterReview:
    """The cluster checks of `job`, against the pods the operator would build for it."""
    return ClusterReview(storage_problems(job), unreachable_paths(job, rayjob_to_review(job)))


def cluster_problems(job: RLJob) -> list[Problem]:
    """Every cluster problem of `job` as an error (`kuberl validate --cluster`)."""
    review = review_for_cluster(job)
    return review.refusals + review.unreachable


def rayjob_to_review(job: RLJob) -> dict[str, Any]:
    """The first RayJob the operator would build for `job` (its pod templates are what the check reads)."""
    owner = builders.Owner(name=job.metadata.name, namespace=job.metadata.namespace or "default", uid="")
    return builders.build_rayjob(job, owner, 0, default_image=REVIEW_IMAGE, generation=1)


def storage_problems(job: RLJob) -> list[Problem]:
    """Checkpoints on storage every pod of the job shares: a claim (a path inside its mount) or an object store."""
    checkpoint = job.spec.checkpoint
    uri = checkpoint.uri
    if uri is not None and uri.partition("://")[0] in OBJECT_STORE_SCHEMES:
        return []
    if checkpoint.pvc_claim_name is None:
        return [
            Problem(
                "spec.checkpoint",
                "on Kubernetes every trainer rank writes its checkpoint shards on its own pod and the head commits "
                "them, so checkpoints need storage all pods share: set pvcClaimName (a ReadWriteMany claim, mounted "
                f"at {contract.CHECKPOINT_MOUNT_DIR} in every pod) or uri: s3://bucket/prefix (with secretRef). "
                "Without either they would land on the head's ephemeral disk, where no restart can resume them",
            )
        ]
    path = local_path(uri) if uri is not None else None
    if path is not None and posixpath.isabs(path) and not is_under(path, contract.CHECKPOINT_MOUNT_DIR):
        return [
            Problem(
                "spec.checkpoint.uri",
                f"{uri} is outside {contract.CHECKPOINT_MOUNT_DIR}, where every pod mounts pvcClaimName, so each pod "
                f"would write its own disk; give a path under {contract.CHECKPOINT_MOUNT_DIR}/, or a relative path "
                "(inside the job's folder on the claim), or remove uri",
            )
        ]
    return []


def is_under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it (`/models/a` is under `/models`, `/models2` is not)."""
    path, folder = posixpath.normpath(path), posixpath.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def pod_mounts(rayjob: dict[str, Any]) -> dict[str, list[str]]:
    """Pool -> where the Ray container of its pods mounts volumes that may hold the job's files.

    The Ray container is the first, as KubeRay takes it; the spec ConfigMap's mount is left out: it holds
    the manifest alone.
    """
    cluster = rayjob["spec"]["rayClusterSpec"]
    groups = [(HEAD_POOL, cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    mounts: dict[str, list[str]] = {}
    for pool, group in groups:
        ray_container = group["template"]["spec"]["containers"][0]  # never emptied (api/kuberay.py)
        mounts[pool] = [
            mount["mountPath"]
            for mount in ray_container.get("volumeMounts", [])
            if mount.get("name") != builders.SPEC_VOLUME and "mountPath" in mount
        ]
    return mounts


def unreachable_paths(job: RLJob, rayjob: dict[str, Any]) -> list[Problem]:
    """One problem per local path that some pod reading it cannot see, naming the field, the path and those pods."""
    mounts = pod_mounts(rayjob)
    problems = []
    for read in local_reads(job.spec):
        if not posixpath.isabs(read.path):
            problems.append(
                Problem(
                    read.field,
                    f"{read.path} is relative: the runtime reads it from the manifest's folder, which on Kubernetes "
                    f"is the spec's mount {contract.SPEC_MOUNT_DIR} holding the manifest alone; give an absolute "
                    "path on a volume the pods mount, or a URI (hf://, s3://, tiny://)",
                )
            )
            continue
        if is_under(read.path, contract.IMAGE_FILES_DIR):
            continue
        blind = [pool for pool in read.pools if not any(is_under(read.path, folder) for folder in mounts[pool])]
        if blind:
            templates = ", ".join(f"spec.resources.{pool}.podTemplate" for pool in blind)
            pods = ", ".join(blind)
            problems.append(
                Problem(
                    read.field,
                    f"{read.path} is read on the {pods} pods, which mount no volume holding it; mount one in "
                    f"{templates} (a volume, and a volumeMount of the container ray-head or ray-worker), or use a "
                    f"URI (hf://, s3://, tiny://); only files under {contract.IMAGE_FILES_DIR} come with kuberl's "
                    "images",
                )
            )
    return problems
