"""A worker group: the ranks of one role's pool as Ray actors, called together.

On Kubernetes each group's actors ask for a custom Ray resource (`kuberl_<role>`) that only
that role's worker group offers, so they land on their own pods; locally there is no such
resource and they share the machine.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.deadline import bounded_get


def worker_device() -> torch.device:
    """This actor's device: the GPU Ray gave it (CUDA_VISIBLE_DEVICES is set), else the CPU."""
    use_cuda = torch.cuda.is_available() and bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return torch.device("cuda", 0) if use_cuda else torch.device("cpu")


@dataclass(frozen=True)
class GroupResources:
    replicas: int
    cpus: float
    gpus: int

    #: False: one rank per GPU (FSDP trainers); True: one worker per replica spanning its GPUs (a TP engine)
    worker_per_replica: bool = False

    @property
    def world_size(self) -> int:
        return self.replicas if self.worker_per_replica else self.replicas * max(1, self.gpus)

    @property
    def gpus_per_worker(self) -> int:
        if not self.gpus:
            return 0
        return self.gpus if self.worker_per_replica else 1


def role_resource(role: str) -> str:
    return f"kuberl_{role}"


class WorkerGroup:
    def __init__(self, worker_cls: type, role: str, resources: GroupResources, env: dict[str, str] | None = None):
        self.role = role
        self.world_size = resources.world_size
        per_rank_cpus = resources.cpus / (resources.world_size // resources.replicas)
        custom = {role_resource(role): 0.001} if role_resource(role) in ray.cluster_resources() else {}
        remote: Any = ray.remote(worker_cls).options(
            num_cpus=per_rank_cpus,
            num_gpus=resources.gpus_per_worker,
            resources=custom,
            runtime_env={"env_vars": env or {}},
            max_concurrency=1,
        )
        self.workers: list[Any] = [remote.remote(rank, self.world_size) for rank in range(self.world_size)]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The same call on every rank; results in rank order. Within a step, bounded by its deadline."""
        return bounded_get([getattr(w, method).remote(*args, **kwargs) for w in self.workers], self._what(method))

    def call_each(self, method: str, per_rank: Sequence[Any], **kwargs: Any) -> list[Any]:
        """Rank r gets `per_rank[r]` as its first argument."""
        return bounded_get(
            [getattr(w, method).remote(arg, **kwargs) for w, arg in zip(self.workers, per_rank, strict=True)],
            self._what(method),
        )

    def call_sharded(self, method: str, batch: RolloutBatch, **kwargs: Any) -> list[Any]:
        """Rank r gets shard r of `batch` (equal contiguous parts)."""
        return self.call_each(method, batch.shard(self.world_size), **kwargs)

    def _what(self, method: str) -> str:
        return f"{method} on the {self.role} workers"

    def kill(self) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
