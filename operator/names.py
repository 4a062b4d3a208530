"""Names, labels and annotations of what the operator creates: deterministic, so a crash never duplicates.

A RayJob is `<rljob>-<index>`, where the index counts the job's RayJobs (0 for the first; each
restart from a checkpoint, resume after suspend or accepted spec change takes the next one). The
current name is written into `status.rayJobName` before the RayJob is created, so a pass that dies
between the two finds the name and creates exactly that RayJob. The spec ConfigMap is `<rljob>-spec`.
"""

from kuberl.api import GROUP, PLURAL, VERSION

#: The one field manager the operator writes with (server-side apply), so fields others own survive.
FIELD_MANAGER = "kuberl-operator"
#: Label on every child: the RLJob it belongs to (also the selector the operator lists children by).
JOB_LABEL = "kuberl.io/job"
#: Label and annotation on a RayJob: its index; above 0 the runtime resumes from the latest checkpoint.
RESTART_LABEL = "kuberl.io/restart"
#: Annotation on children: the RLJob metadata.generation whose spec they were built from.
GENERATION_ANNOTATION = "kuberl.io/generation"
#: Kueue's labels on a job it manages: the LocalQueue it waits in, and its WorkloadPriorityClass.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
#: Where the ConfigMap is mounted in every pod, and the key holding the RLJob manifest.
SPEC_MOUNT_DIR = "/etc/kuberl"
SPEC_KEY = "rljob.yaml"
SPEC_PATH = f"{SPEC_MOUNT_DIR}/{SPEC_KEY}"
#: Where spec.checkpoint.pvcClaimName is mounted in every pod.
CHECKPOINT_MOUNT_DIR = "/checkpoints"

RAY_GROUP, RAY_VERSION = "ray.io", "v1"
RAY_API_VERSION = f"{RAY_GROUP}/{RAY_VERSION}"
RLJOB_API_VERSION = f"{GROUP}/{VERSION}"


def rayjob_name(job: str, index: int) -> str:
    """`tiny-grpo`, 1 -> `tiny-grpo-1`."""
    return f"{job}-{index}"


def rayjob_index(job: str, rayjob: str | None) -> int | None:
    """The index in a RayJob name of this job (`tiny-grpo-1` -> 1); None for no name or another job's."""
    prefix = f"{job}-"
    if rayjob is None or not rayjob.startswith(prefix) or not rayjob[len(prefix) :].isdigit():
        return None
    return int(rayjob[len(prefix) :])


def next_rayjob_name(job: str, current: str | None) -> str:
    """The name after `current`: `<job>-0` when there was none."""
    index = rayjob_index(job, current)
    return rayjob_name(job, 0 if index is None else index + 1)


def configmap_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-spec`."""
    return f"{job}-spec"


def ray_resource_name(role: str) -> str:
    """The custom Ray resource only the role's worker group offers: `reward` -> `kuberl_reward`."""
    return f"kuberl_{role}"


def rljob_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return base if name is None else f"{base}/{name}"


def rayjob_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{namespace}/rayjobs"
    return base if name is None else f"{base}/{name}"


def configmap_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    return base if name is None else f"{base}/{name}"


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"
