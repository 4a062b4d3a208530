"""FAKE of what KubeRay does for a RayCluster with in-tree autoscaling, for tests: KubeRay cannot run here.

Transcribed from ray-project/kuberay v1.6.2, ray-operator/controllers/ray:
- common/pod.go `DefaultHeadPodTemplate`: the head pod runs as `GetHeadGroupServiceAccountName` (the template's
  serviceAccountName, else the cluster's name), and gets the autoscaler container (`BuildAutoscalerContainer`,
  named `autoscaler`) appended, with `autoscalerOptions.volumeMounts` appended to its mounts
  (`mergeAutoscalerOverrides`);
- common/rbac.go `BuildRole`/`BuildRoleBinding`: a Role named after the cluster over every pod and RayCluster of
  the namespace, bound to that same ServiceAccount;
- Kubernetes' ServiceAccount admission then mounts the pod's own token into every container at
  /var/run/secrets/kubernetes.io/serviceaccount, unless the pod says automountServiceAccountToken: false.
"""

import copy
from typing import Any

from kuberl.api import contract

AUTOSCALER_CONTAINER = "autoscaler"  # common/constant.go AutoscalerContainerName
#: common/rbac.go BuildRole, v1.6.2: no resourceNames, every pod and RayCluster of the namespace.
AUTOSCALER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
]


def head_pod(rayjob: dict[str, Any], cluster_name: str) -> dict[str, Any]:
    """The head pod KubeRay makes of the RayJob's head template (only what decides who holds which token)."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod = copy.deepcopy(cluster["headGroupSpec"]["template"])
    spec = pod["spec"]
    spec["serviceAccountName"] = spec.get("serviceAccountName") or cluster_name
    if cluster.get("enableInTreeAutoscaling"):
        options = cluster.get("autoscalerOptions") or {}
        autoscaler = {"name": AUTOSCALER_CONTAINER, "volumeMounts": list(options.get("volumeMounts") or [])}
        spec["containers"].append(autoscaler)
    return pod


def autoscaler_role_binding(pod: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(the rules KubeRay's autoscaler Role grants, the ServiceAccount it binds them to)."""
    return AUTOSCALER_RULES, pod["spec"]["serviceAccountName"]


def token_holder(pod: dict[str, Any], container: dict[str, Any], secrets: dict[str, dict[str, Any]]) -> str | None:
    """The ServiceAccount whose token `container` can read at Kubernetes' usual place, or None.

    A volume mounted there is a projected token of the pod's own account, or a Secret of type
    kubernetes.io/service-account-token of the account its annotation names; with nothing mounted there the
    ServiceAccount admission mounts the pod's own token unless automountServiceAccountToken is false."""
    spec = pod["spec"]
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    mounted = [m for m in container.get("volumeMounts", []) if m["mountPath"] == contract.SERVICE_ACCOUNT_DIR]
    if not mounted:
        return spec["serviceAccountName"] if spec.get("automountServiceAccountToken", True) else None
    (mount,) = mounted
    volume = volumes[mount["name"]]
    if "projected" in volume and any("serviceAccountToken" in s for s in volume["projected"]["sources"]):
        return str(spec["serviceAccountName"])
    if "secret" in volume:
        secret = secrets[volume["secret"]["secretName"]]
        assert secret["type"] == "kubernetes.io/service-account-token"
        return str(secret["metadata"]["annotations"]["kubernetes.io/service-account.name"])
    return None
