"""A worker group: the actors of one topology group (api/topology.py), called together.

Every actor asks Ray for its pool's custom resource (`kuberl_<pool>`, one unit) besides its CPUs
and GPUs, on a cluster and locally alike: on Kubernetes only that pool's pods offer it, so the
actors land on their own pods; a local run starts Ray offering what every pool offers
(runtime/pools/launch.py).
"""

import os
from collections.abc import Sequence
from typing import Any

import ray
import torch

from kuberl.api.topology import ActorGroup
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.deadline import bounded_get

#: How long a group's workers get to shut down (stop their engines) before they are killed.
STOP_TIMEOUT_S = 30.0


def worker_device() -> torch.device:
    """This actor's device: the GPU Ray gave it (CUDA_VISIBLE_DEVICES is set), else the CPU."""
    use_cuda = torch.cuda.is_available() and bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return torch.device("cuda", 0) if use_cuda else torch.device("cpu")


def ray_actor_options(group: ActorGroup) -> dict[str, Any]:
    """What each actor of `group` asks Ray for: its CPUs and GPUs, and its unit of the pool's resource."""
    return {"num_cpus": group.cpus, "num_gpus": group.gpus, "resources": group.ray_resources}


def call_outcome(ref: Any) -> tuple[Any, BaseException | None]:
    """A finished call's value, or the error it ended with (the elastic pools sort their workers' answers)."""
    try:
        return ray.get(ref), None
    except Exception as error:  # the worker's own exception (RayTaskError) or its death (RayActorError)
        return None, error


class WorkerGroup:
    """The `group.actors` ranks of one group; rank r is `workers[r]`."""

    def __init__(self, worker_cls: type, group: ActorGroup, env: dict[str, str] | None = None) -> None:
        self.group = group
        self.world_size = group.actors
        remote: Any = ray.remote(worker_cls).options(
            **ray_actor_options(group), runtime_env={"env_vars": env or {}}, max_concurrency=1
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
        return f"{method} on the {self.group.name} workers"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask every worker to shut down (its engine and process group; see ModelWorker.shutdown), then kill
        them: a worker that does not answer within `timeout_s` is killed anyway."""
        calls = [worker.shutdown.remote() for worker in self.workers]
        ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
        self.kill()

    def kill(self) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
