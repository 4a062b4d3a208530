"""Names, labels and annotations of what the operator creates: deterministic, so a crash never duplicates.

A RayJob is `<rljob>-<index>`, where the index counts the job's RayJobs (0 for the first; each
restart from a checkpoint, resume after suspend or accepted spec change takes the next one). The
current name is written into `status.rayJobName` before the RayJob is created, so a pass that dies
between the two finds the name and creates exactly that RayJob. The spec ConfigMap is `<rljob>-spec`;
the per-job access objects (access.py) are `<rljob>-runtime`, `<rljob>-progress`, `<rljob>-ray-token`
and `<rljob>-ray`. What the runtime must find in the pods (mounts, environment, Ray resources) is in
api/contract.py.
"""

from kuberl.api import GROUP, PLURAL, VERSION
from kuberl.api.contract import OPERATOR_FIELD_MANAGER

#: The one field manager the operator writes with (server-side apply), so fields others own survive.
FIELD_MANAGER = OPERATOR_FIELD_MANAGER
#: Label on every child: the RLJob it belongs to (also the selector the operator lists children by).
JOB_LABEL = "kuberl.io/job"
#: Label and annotation on a RayJob: its index; above 0 the runtime resumes from the latest checkpoint.
RESTART_LABEL = "kuberl.io/restart"
#: Label of the ConfigMap the runtime reports into (`kuberl.io/component: progress`); the operator watches those.
COMPONENT_LABEL = "kuberl.io/component"
PROGRESS_COMPONENT = "progress"
#: Annotation on children: the RLJob metadata.generation whose spec they were built from.
GENERATION_ANNOTATION = "kuberl.io/generation"
#: Kueue's labels on a job it manages: the LocalQueue it waits in, and its WorkloadPriorityClass.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
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


def progress_configmap_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-progress`: the runtime's report (progress, metrics, last checkpoint)."""
    return f"{job}-progress"


def runtime_account_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-runtime`: the ServiceAccount, Role and RoleBinding of the job's pods."""
    return f"{job}-runtime"


def autoscaler_account_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-autoscaler`: the head pod's ServiceAccount when a pool is elastic, to which KubeRay
    binds its autoscaler's Role; only the autoscaler's container holds its token (builders.py)."""
    return f"{job}-autoscaler"


def runtime_token_secret_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-runtime-token`: a token of `<job>-runtime` for the head's Ray container when the
    head pod runs as the autoscaler's account (a Secret of type kubernetes.io/service-account-token)."""
    return f"{job}-runtime-token"


def ray_token_secret_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-ray-token`: the Ray cluster's authentication token."""
    return f"{job}-ray-token"


def network_policy_name(job: str) -> str:
    """`tiny-grpo` -> `tiny-grpo-ray`: who may connect to the job's Ray pods."""
    return f"{job}-ray"


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


#: The REST collection of each kind the operator writes: (API prefix, plural).
COLLECTIONS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "RayJob": (f"/apis/{RAY_GROUP}/{RAY_VERSION}", "rayjobs"),
}


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    """The REST path of a namespaced object the operator writes (or of its collection, without a name)."""
    prefix, plural = COLLECTIONS[kind]
    base = f"{prefix}/namespaces/{namespace}/{plural}"
    return base if name is None else f"{base}/{name}"
