"""FAKE of KubeRay's own validation of a RayJob, for tests: KubeRay cannot run here.

A transcription into Python of ray-project/kuberay v1.6.2 ray-operator/controllers/ray/utils/validation.go,
`ValidateRayJobMetadata`, `ValidateRayJobSpec` and the `ValidateRayClusterSpec` it calls (with util.go's
`IsAutoscalingEnabled`, `IsGCSFaultToleranceEnabled`, `EnvVarExists`/`EnvVarByName`, which take the first match),
in the order KubeRay checks, each refusal in KubeRay's words. It reads the RayJob as kuberl builds it (a dict);
the branches for fields kuberl never writes (clusterSelector, deletionStrategy, submitterPodTemplate, sidecar and
interactive modes, upgradeStrategy, autoscalerOptions.version, group-level labels and resources) are
transcribed where cheap and otherwise noted, so a test fails loudly if kuberl starts writing them.
"""

import re
from typing import Any

import yaml

MAX_RAYJOB_NAME_LENGTH = 47  # utils/constant.go MaxRayJobNameLength
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NEVER_WRITTEN = ("clusterSelector", "deletionStrategy", "submitterPodTemplate", "submitterConfig")
INVALID = "The RayJob spec is invalid: "


def first_env(name: str, container: dict[str, Any]) -> dict[str, Any] | None:
    return next((entry for entry in container.get("env") or [] if entry.get("name") == name), None)


def version_tuple(text: str) -> tuple[int, ...] | None:
    found = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in found.groups()) if found else None


def kuberay_refusal(rayjob: dict[str, Any]) -> str | None:
    """KubeRay's error for this RayJob, or None when KubeRay 1.6.2 would accept it."""
    name = rayjob["metadata"]["name"]
    if len(name) > MAX_RAYJOB_NAME_LENGTH:
        return (
            "The RayJob metadata is invalid: "
            + f"RayJob name should be no more than {MAX_RAYJOB_NAME_LENGTH} characters"
        )
    if not DNS1035.match(name):
        return "The RayJob metadata is invalid: RayJob name should be a valid DNS1035 label"
    spec = rayjob["spec"]
    assert not any(key in spec for key in NEVER_WRITTEN), "transcribe the rules for these fields first"
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        return INVALID + "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        return "The RayJob spec is invalid: TTLSecondsAfterFinished must be a non-negative integer"
    if not spec.get("shutdownAfterJobFinishes") and (spec.get("ttlSecondsAfterFinished") or 0) > 0:
        return INVALID + "a RayJob with shutdownAfterJobFinishes set to false cannot have TTLSecondsAfterFinished"
    if spec.get("rayClusterSpec") is None:
        return "The RayJob spec is invalid: one of RayClusterSpec or ClusterSelector must be set"
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        return "The RayJob spec is invalid: BackoffLimit is incompatible with InteractiveMode"
    assert mode != "SidecarMode", "transcribe the SidecarMode rules first"
    cluster = spec["rayClusterSpec"]
    if (cluster.get("authOptions") or {}).get("enableK8sTokenAuth"):
        return "The RayJob spec is invalid: K8s token auth mode is currently not supported for RayJob"
    refused = cluster_refusal(cluster, rayjob["metadata"].get("annotations") or {})
    if refused is not None:
        return f"The RayJob spec is invalid: {refused}"
    try:
        yaml.safe_load(spec.get("runtimeEnvYAML") or "")
    except yaml.YAMLError as error:
        return f"runtimeEnvYAML: {error}"
    for field in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if field in spec and spec[field] <= 0:
            return f"The RayJob spec is invalid: {field} must be a positive integer"
    if (spec.get("backoffLimit") or 0) < 0:
        return "The RayJob spec is invalid: backoffLimit must be a positive integer"
    return None


def cluster_refusal(cluster: dict[str, Any], annotations: dict[str, str]) -> str | None:
    """`ValidateRayClusterSpec`: the first rule the RayCluster spec breaks, in KubeRay's words."""
    head = cluster["headGroupSpec"]
    head_containers = head["template"]["spec"].get("containers") or []
    if not head_containers:
        return "headGroupSpec should have at least one container"
    for group in [head, *(cluster.get("workerGroupSpecs") or [])]:
        assert "resources" not in group and "labels" not in group, "transcribe validateRayGroupResources/Labels"
        assert "labels" not in group.get("rayStartParams", {}), "rayStartParams['labels'] is not supported"
    autoscaling = bool(cluster.get("enableInTreeAutoscaling"))
    for group in cluster.get("workerGroupSpecs") or []:
        if not group["template"]["spec"].get("containers"):
            return "workerGroupSpec should have at least one container"
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            return f"worker group {group['groupName']} must set both minReplicas and maxReplicas " + (
                "when autoscaling is disabled"
            )
        if low is not None and low < 0 or high is not None and high < 0:
            return f"worker group {group['groupName']} has negative minReplicas or maxReplicas"
        if low is not None and high is not None and low > high:
            return f"worker group {group['groupName']} has minReplicas {low} greater than maxReplicas {high}"
        assert "idleTimeoutSeconds" not in group, "transcribe validateWorkerGroupIdleTimeout"
    fault_tolerant = annotations.get("ray.io/ft-enabled", "").lower() == "true" or "gcsFaultToleranceOptions" in cluster
    ray_container = head_containers[0]
    if not fault_tolerant and first_env("RAY_REDIS_ADDRESS", ray_container) is not None:
        return (
            "RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but GcsFaultToleranceOptions is "
            "not set. Please set GcsFaultToleranceOptions to enable GCS fault tolerance"
        )
    assert "gcsFaultToleranceOptions" not in cluster, "transcribe the GcsFaultToleranceOptions rules first"
    if head.get("rayStartParams", {}).get("redis-username") or first_env("REDIS_USERNAME", ray_container):
        return (
            "cannot set redis username in rayStartParams or environment variables - use "
            "GcsFaultToleranceOptions.RedisUsername instead"
        )
    assert not any(g.get("suspend") for g in cluster.get("workerGroupSpecs") or []), "worker group suspend"
    v2 = first_env("RAY_enable_autoscaler_v2", ray_container)
    if not autoscaling and v2 is not None and v2.get("value") in ("1", "true"):
        return (
            f"environment variable RAY_enable_autoscaler_v2 cannot be set to '{v2['value']}' when "
            "enableInTreeAutoscaling is false. Please set enableInTreeAutoscaling: true to use autoscaler v2"
        )
    assert "version" not in (cluster.get("autoscalerOptions") or {}), "transcribe the autoscaler v2 rules first"
    if (cluster.get("authOptions") or {}).get("mode") == "token":
        version = cluster.get("rayVersion") or ""
        if not version:
            return "authOptions.mode is 'token' but RayVersion was not specified. " + (
                "Ray version 2.52.0 or later is required"
            )
        parsed = version_tuple(version)
        if parsed is None:
            return f"authOptions.mode is 'token' but RayVersion format is invalid: {version}"
        if parsed < (2, 52, 0):
            return f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {version}"
    return None
