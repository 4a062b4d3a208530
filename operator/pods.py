"""Pod-template pieces of a role's Ray pods, and the merge of a role's `podTemplate` override over them.

Pure functions of their arguments. The merge follows the spirit of a strategic merge patch, simply:
mappings merge key by key (the override wins), lists of mappings that all carry a `name`
(containers, volumes, env, ports ...) merge item by item by name (new names are appended), and any
other list is replaced by the override's.
"""

import copy
from typing import Any, Protocol

GPU_RESOURCE = "nvidia.com/gpu"
#: Pod Security Standards `restricted` (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
#: no root, the runtime's default seccomp profile, and per container no privilege escalation and no
#: capabilities. The runtime images run as uid 10001; an image whose USER is root fails to start (the
#: kubelet names runAsNonRoot), and a pool's podTemplate may set runAsUser.
POD_SECURITY_CONTEXT: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


class PodSize(Protocol):
    """What one pod is given: a topology Pool, or the spec.resources entry it was made from."""

    @property
    def cpus(self) -> float: ...
    @property
    def gpus(self) -> int: ...
    @property
    def memory(self) -> str | None: ...


def cpu_quantity(cpus: float) -> str:
    """Whole cores as an integer, fractions in millicores: 4.0 -> "4", 0.5 -> "500m", 1.25 -> "1250m"."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(cpus * 1000)}m"


def container_resources(pool: PodSize, ephemeral_storage: str | None = None) -> dict[str, dict[str, Any]]:
    """Requests equal limits (Guaranteed QoS): CPU, memory when set, `nvidia.com/gpu` when the role has GPUs, and
    ephemeral storage when given (the pools that run tool calls, api/topology.py)."""
    amounts: dict[str, Any] = {"cpu": cpu_quantity(pool.cpus)}
    if pool.memory is not None:
        amounts["memory"] = pool.memory
    if pool.gpus > 0:
        amounts[GPU_RESOURCE] = pool.gpus
    if ephemeral_storage is not None:
        amounts["ephemeral-storage"] = ephemeral_storage
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _is_named_list(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)


def merge_named(base: list[Any], override: list[Any]) -> list[Any]:
    """Items of `override` merged into the items of `base` with the same name; unknown names appended."""
    merged = [copy.deepcopy(item) for item in base]
    positions = {item["name"]: index for index, item in enumerate(merged)}
    for item in override:
        if item["name"] in positions:
            merged[positions[item["name"]]] = merge(merged[positions[item["name"]]], item)
        else:
            positions[item["name"]] = len(merged)
            merged.append(copy.deepcopy(item))
    return merged


def merge(base: Any, override: Any) -> Any:
    """`override` laid over `base` (see the module docstring); neither argument is changed."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = {key: copy.deepcopy(value) for key, value in base.items()}
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(override, list) and _is_named_list(base) and _is_named_list(override):
        return merge_named(base, override)
    return copy.deepcopy(override)
