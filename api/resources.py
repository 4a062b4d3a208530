"""`spec.resources`: the pool of machines each role runs on (one Ray worker group per role on Kubernetes)."""

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kuberl.api.base import KuberlModel
from kuberl.api.enums import Role
from kuberl.api.limits import MAX_DURATION_SECONDS
from kuberl.api.pod_template import pod_template_problems
from kuberl.api.rules import RESOURCES_RULES, raise_problems, raise_rule_problems

#: A Kubernetes resource quantity such as 16Gi, 512Mi or 1e9 — the subset kuberl accepts.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def label_problem(key: str, value: str) -> str | None:
    """What Kubernetes would refuse about a node label selector entry, or None (prefix <= 253, name and value <= 63)."""
    prefix, _, name = key.rpartition("/")
    if not re.fullmatch(LABEL_KEY_PATTERN, key) or len(prefix) > 253 or len(name) > 63:
        return (
            f"{key!r} is not a label key: an optional DNS prefix and '/', then up to 63 letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit (e.g. nvidia.com/gpu.product)"
        )
    if not re.fullmatch(LABEL_VALUE_PATTERN, value) or len(value) > 63:
        return f"the value of {key!r}, {value!r}, is not a label value (up to 63 letters, digits, '-', '_' or '.')"
    return None


class Toleration(KuberlModel):
    """A Kubernetes toleration, copied into the role's pods."""

    key: str | None = Field(None, description="Taint key the toleration applies to; empty matches all keys.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value to match when operator is Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_DURATION_SECONDS,
        description="NoExecute only: how long the pod stays bound after the taint appears.",
    )


class PodPlacement(KuberlModel):
    """Where a pool's pods land and what is added to them: node labels, tolerations, a partial pod template."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must land on, e.g. a GPU type."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Taints the pods tolerate.")
    pod_template: dict[str, Any] | None = Field(
        None,
        description="A partial pod template merged over the one kuberl builds for these pods "
        "(extra volumes, annotations, a priority class ...). Containers merge by name: Ray runs in the container "
        "ray-head on the head and ray-worker in a pool, so a volume the job reads (models, data) needs a "
        "volumeMount under that name. Every field must be one of a Kubernetes pod template (as KubeRay's RayJob "
        "takes it), of its type, and every container, env entry and volume needs a name.",
    )

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        problems = [problem for key, label in value.items() if (problem := label_problem(key, label))]
        if problems:
            raise PydanticCustomError("label_key", "; ".join(problems))
        return value

    @field_validator("pod_template")
    @classmethod
    def _is_a_pod_template(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise_problems(pod_template_problems(value))
        return value


class RoleResources(PodPlacement):
    """Machines for one role. On CPU each replica is one worker; on GPU each GPU of each replica is one rank."""

    replicas: int = Field(1, ge=1, le=4096, description="Replicas (pods on Kubernetes, Ray actors locally).")
    min_replicas: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="Elastic roles (reward, separate rollout): the fewest replicas the autoscaler keeps. "
        "Default: replicas.",
    )
    max_replicas: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Elastic roles (reward, separate rollout): the most replicas the autoscaler adds. "
        "Default: replicas.",
    )
    gpus: int = Field(0, ge=0, le=64, description="GPUs per replica (nvidia.com/gpu limit); 0 runs on CPU.")
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU cores per replica (fractions allowed).")
    memory: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="Memory per replica as a Kubernetes quantity, e.g. 64Gi. Default: no limit is set.",
    )

    @property
    def effective_min(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def effective_max(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def is_elastic(self) -> bool:
        return self.effective_min < self.effective_max

    @property
    def world_size(self) -> int:
        """Training ranks this pool provides: one per GPU, or one per replica on CPU."""
        return self.replicas * max(1, self.gpus)


class HeadResources(PodPlacement):
    """The Ray head pod: it runs the controller (the driver) and, without a reward pool, the reward worker.
    Its CPUs and memory are the operator's settings (KUBERL_HEAD_CPU / KUBERL_HEAD_MEMORY)."""


class ResourcesSpec(KuberlModel):
    """Per-role pools. A role without an entry shares the actor's pool (colocated)."""

    head: HeadResources | None = Field(
        None,
        description="The Ray head pod's placement and additions: a volume the controller reads from (local "
        "models or data, which it resolves before the workers start), a node, tolerations.",
    )

    actor: RoleResources = Field(
        default_factory=RoleResources,
        description="The actor's pool: FSDP training, and generation when the rollout is colocated.",
    )
    critic: RoleResources | None = Field(None, description="A pool of its own for the critic. Default: the actor's.")
    reference: RoleResources | None = Field(
        None, description="A pool of its own for the reference model. Default: the actor's."
    )
    reward: RoleResources | None = Field(
        None,
        description="The reward pool (reward model, function or endpoint callers); elastic with "
        "minReplicas < maxReplicas. Default: one reward worker beside the controller.",
    )
    rollout: RoleResources | None = Field(
        None,
        description="The rollout pool; only with rollout.placement: separate. Elastic with minReplicas < "
        "maxReplicas: a step's prompts are cut into maxReplicas chunks queued for the replicas, and the pool grows "
        "while chunks wait and releases replicas idle for a minute (the reward pool's policy). A replica that "
        "joins loads the newest weights before it generates; a replica that dies mid-generation has its chunk "
        "generated once by another, and is replaced when the pool falls below minReplicas.",
    )

    @property
    def autoscaled(self) -> bool:
        """Whether any pool is elastic: the operator then turns KubeRay's in-tree autoscaler on."""
        pools = (getattr(self, role.value) for role in Role)
        return any(pool is not None and pool.is_elastic for pool in pools)

    @model_validator(mode="after")
    def _rules(self) -> "ResourcesSpec":
        raise_rule_problems(self, RESOURCES_RULES)
        return self
