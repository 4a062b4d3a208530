"""A worker group: the actors of one topology group (api/topology.py), called together.

Every actor asks Ray for its pool's custom resource (`kuberl_<pool>`, one unit) besides its CPUs
and GPUs, on a cluster and locally alike: on Kubernetes only that pool's pods offer it, so the
actors land on their own pods; a local run starts Ray offering what every pool offers
(runtime/pools/launch.py).
"""

import contextlib
import os
from collections.abc import Iterator, Sequence
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


class WarmWorkers:
    """Worker processes kept between the runs of one driver process, for the next run that asks for the same.

    A Ray actor is a process of its own, and a model worker's process spends seconds importing torch, FSDP and
    transformers before it does anything (more on a busy machine). A driver that runs one job after another in
    the same Ray (the test suite, a benchmark, a sweep from a notebook) can keep the processes of a run that
    ended well and hand them to the next run's group of the same shape: the same worker class, CPUs, GPUs, pool
    resource and environment. A kept worker is made new (`reset(rank, world_size)`: the class's `__init__`
    again) before it is used. A group is kept only when every rank answered `shutdown` with True in time (the
    worker says whether its process can host another run: a model worker that started vLLM cannot, since vLLM
    keeps state of its own in the process; nor can one whose torch could not forget the old process group's
    device meshes, since it may come back at another rank: engines/fsdp.py `forget_sharding_caches`); a group
    with a rank that died, failed its shutdown or did not answer is killed, as without this.

    Off unless `keep_workers_warm()` is entered: `kuberl run` and a job on Kubernetes run one job per driver,
    and their workers end with it. Idle workers hold their Ray resources, so `retain` stops those the next run
    cannot use before it starts anything, and leaving `keep_workers_warm()` stops them all.
    """

    def __init__(self) -> None:
        self._idle: dict[tuple[Any, ...], list[Any]] = {}
        self._ray_job: str | None = None  # idle workers belong to the Ray they were started in

    def shape(self, worker_cls: type, group: ActorGroup, env: dict[str, str] | None) -> tuple[Any, ...]:
        """What a kept worker must match to serve `group`: what its process is and what Ray gave it."""
        return (
            worker_cls,
            group.cpus,
            group.gpus,
            tuple(sorted(group.ray_resources.items())),
            tuple(sorted((env or {}).items())),
        )

    def _same_ray(self) -> None:
        job = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
        if job != self._ray_job:  # a new Ray (or a new driver of it): the old one's actors are gone
            self._idle, self._ray_job = {}, job

    def retain(self, shapes: set[tuple[Any, ...]]) -> None:
        """Stop the idle workers of any shape but `shapes` (their resources are free for the next run)."""
        self._same_ray()
        for shape in [shape for shape in self._idle if shape not in shapes]:
            for worker in self._idle.pop(shape):
                ray.kill(worker)

    def take(self, shape: tuple[Any, ...], world_size: int) -> list[Any]:
        """Up to `world_size` idle workers of `shape`, reset as ranks 0.. of a new group (the dead ones dropped)."""
        self._same_ray()
        idle = self._idle.get(shape, [])
        taken, self._idle[shape] = idle[:world_size], idle[world_size:]
        if not taken:
            return []
        resets = [worker.reset.remote(rank, world_size) for rank, worker in enumerate(taken)]
        ready, _ = ray.wait(resets, num_returns=len(resets), timeout=STOP_TIMEOUT_S)
        alive = []
        for worker, reset in zip(taken, resets, strict=True):
            if reset in ready and call_outcome(reset)[1] is None:
                alive.append(worker)
            else:
                ray.kill(worker)
        return alive

    def give(self, shape: tuple[Any, ...], workers: list[Any]) -> None:
        self._same_ray()
        self._idle.setdefault(shape, []).extend(workers)

    def idle(self) -> list[Any]:
        """The workers kept now, waiting for a run."""
        return [worker for workers in self._idle.values() for worker in workers]

    def stop_all(self) -> None:
        self.retain(set())


#: The kept workers while `keep_workers_warm()` is entered, else None.
_warm: WarmWorkers | None = None


@contextlib.contextmanager
def keep_workers_warm() -> Iterator[WarmWorkers]:
    """Within: worker groups reuse the processes of earlier runs of this driver (WarmWorkers says when).
    Entered again inside, it keeps the outer one's workers."""
    global _warm
    if _warm is not None:
        yield _warm
        return
    _warm = warm = WarmWorkers()
    try:
        yield warm
    finally:
        _warm = None
        warm.stop_all()


def warm_workers() -> WarmWorkers | None:
    """The kept workers, while `keep_workers_warm()` is entered."""
    return _warm


class WorkerGroup:
    """The `group.actors` ranks of one group; rank r is `workers[r]`."""

    def __init__(self, worker_cls: type, group: ActorGroup, env: dict[str, str] | None = None) -> None:
        self.group = group
        self.world_size = group.actors
        remote: Any = ray.remote(worker_cls).options(
            **ray_actor_options(group), runtime_env={"env_vars": env or {}}, max_concurrency=1
        )
        warm = _warm
        self._shape = warm.shape(worker_cls, group, env) if warm is not None else None
        kept = warm.take(self._shape, self.world_size) if warm is not None and self._shape is not None else []
        self.workers: list[Any] = kept + [
            remote.remote(rank, self.world_size) for rank in range(len(kept), self.world_size)
        ]

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
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
        warm = _warm
        if warm is not None and self._shape is not None and len(done) == len(calls):
            if all(call_outcome(call) == (True, None) for call in calls):  # every rank can host another run
                warm.give(self._shape, self.workers)
                self.workers = []
                return
        self.kill()

    def kill(self) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
