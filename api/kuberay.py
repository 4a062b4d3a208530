"""What KubeRay refuses of the RayJob an RLJob becomes, refused at the door instead.

KubeRay checks a RayJob only after it exists (ray-operator/controllers/ray/rayjob_controller.go `validateRayJob`,
at v1.6.2) and marks one it refuses `ValidationFailed`, past every admission check: the job then fails
(operator/decide.py `_refused`). The rules are in ray-operator/controllers/ray/utils/validation.go (v1.6.2),
`ValidateRayJobSpec` and the `ValidateRayClusterSpec` it calls. These are the ones an RLJob field reaches:

- A group's pod template without a container ("headGroupSpec should have at least one container", and the same
  for a worker group): a `podTemplate` with `containers: []` replaces the operator's list of them.
- In the head's Ray container (the first container, `ray-head`, whose env is `spec.env` and the head
  podTemplate's entries for `ray-head`): `RAY_REDIS_ADDRESS` while GCS fault tolerance is off (the operator never
  turns it on: no gcsFaultToleranceOptions, no ray.io/ft-enabled annotation); `REDIS_USERNAME`, always;
  `RAY_enable_autoscaler_v2` set to `1` or `true` while in-tree autoscaling is off (no elastic pool).

The others read what the operator writes from constants or checks itself: the RayJob's name
(api/manifest.py), minReplicas <= maxReplicas (api/rules.py `replicas_within_bounds`), rayStartParams, the
submission mode, shutdownAfterJobFinishes, the runtime env YAML, rayVersion >= 2.52 for token authentication
(the operator's setting, operator/settings.py).

Token authentication, besides: KubeRay gives a Ray container RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (from the
job's Secret) only when the container does not set them itself (common/pod.go `SetContainerTokenAuthEnvVars`,
v1.6.2), so `RAY_AUTH_MODE=disabled` would turn the job's authentication off and a RAY_AUTH_TOKEN of the user's
would replace its token. Names starting `RAY_AUTH_` are KubeRay's: refused in `spec.env` and in every container
of a podTemplate.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kuberl.api.enums import Role

if TYPE_CHECKING:
    from kuberl.api.rules import RuleProblem
    from kuberl.api.spec import RLJobSpec

#: The container Ray runs in on the head (operator/builders.py names it; KubeRay takes the first container).
HEAD_RAY_CONTAINER = "ray-head"
#: Env names KubeRay refuses in the head's Ray container, with why (validation.go `ValidateRayClusterSpec`).
REFUSED_HEAD_ENV = {
    "RAY_REDIS_ADDRESS": "it turns on GCS fault tolerance, which KubeRay accepts only through "
    "gcsFaultToleranceOptions, and kuberl's jobs run without it",
    "REDIS_USERNAME": "KubeRay takes a Redis user only through gcsFaultToleranceOptions",
}
AUTOSCALER_V2_ENV = "RAY_enable_autoscaler_v2"
#: Env names KubeRay sets for Ray's token authentication (and does not set when the container already does).
RAY_AUTH_PREFIX = "RAY_AUTH_"

#: (path of an env entry's name, the entry)
Located = tuple[tuple[str | int, ...], dict[str, Any]]


def pod_specs(spec: "RLJobSpec") -> Iterator[tuple[str, dict[str, Any]]]:
    """(pool, the `spec` of its podTemplate) of every pool, the head's included; {} without one."""
    for pool in ("head", *(role.value for role in Role)):
        placement = getattr(spec.resources, pool)
        template = placement.pod_template if placement is not None else None
        yield pool, (template or {}).get("spec") or {}


def pod_template_containers(spec: "RLJobSpec") -> Iterator[tuple[str, tuple[str | int, ...], dict[str, Any]]]:
    """(pool, path, container) of every container and init container of every podTemplate (shape checked)."""
    for pool, pod in pod_specs(spec):
        for kind in ("containers", "initContainers"):
            for index, container in enumerate(pod.get(kind) or []):
                yield pool, ("resources", pool, "podTemplate", "spec", kind, index), container


def head_ray_container_env(spec: "RLJobSpec") -> Iterator[Located]:
    """(path of the name, entry) of every env entry the head's Ray container gets: spec.env, then the head's
    podTemplate entries for ray-head (operator/builders.py `pod_env`, merged by operator/pods.py)."""
    for index, var in enumerate(spec.env):
        yield ("env", index, "name"), {"name": var.name, "value": var.value}
    for pool, path, container in pod_template_containers(spec):
        if pool == "head" and path[4] == "containers" and container.get("name") == HEAD_RAY_CONTAINER:
            for index, entry in enumerate(container.get("env") or []):
                yield (*path, "env", index, "name"), entry


def ray_containers_are_kept(spec: "RLJobSpec") -> Iterator["RuleProblem"]:
    """KubeRay refuses a group without a container; `containers: []` would also drop the one Ray runs in."""
    for pool, pod in pod_specs(spec):
        if pod.get("containers") == []:
            ray = HEAD_RAY_CONTAINER if pool == "head" else "ray-worker"
            yield (
                ("resources", pool, "podTemplate", "spec", "containers"),
                f"an empty list replaces the pod's containers, {ray} (where Ray runs) included, and KubeRay refuses "
                "a pod without one; leave containers out, or list only the containers to add or change, by name",
            )


def head_env_kuberay_accepts(spec: "RLJobSpec") -> Iterator["RuleProblem"]:
    autoscaled = spec.resources.autoscaled
    for path, entry in head_ray_container_env(spec):
        name = entry.get("name")
        if name in REFUSED_HEAD_ENV:
            yield path, f"{name} in the head's Ray container: {REFUSED_HEAD_ENV[name]}; KubeRay would refuse the RayJob"
        elif name == AUTOSCALER_V2_ENV and entry.get("value") in ("1", "true") and not autoscaled:
            yield (
                path,
                f"{name}={entry['value']} asks for Ray's autoscaler v2, which KubeRay allows only with in-tree "
                "autoscaling, on only when a pool is elastic (minReplicas < maxReplicas); KubeRay would refuse "
                "the RayJob. Remove it",
            )


def ray_auth_is_kuberays(spec: "RLJobSpec") -> Iterator["RuleProblem"]:
    message = (
        "{name}: RAY_AUTH_* variables are KubeRay's (Ray's token authentication with the job's own token); "
        "set here, they would replace its settings, and RAY_AUTH_MODE=disabled would turn authentication off"
    )
    for index, var in enumerate(spec.env):
        if var.name.startswith(RAY_AUTH_PREFIX):
            yield ("env", index, "name"), message.format(name=var.name)
    for _, path, container in pod_template_containers(spec):
        for index, entry in enumerate(container.get("env") or []):
            name = entry.get("name")
            if isinstance(name, str) and name.startswith(RAY_AUTH_PREFIX):
                yield (*path, "env", index, "name"), message.format(name=name)


KUBERAY_RULES = (ray_containers_are_kept, head_env_kuberay_accepts, ray_auth_is_kuberays)
