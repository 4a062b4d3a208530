"""The environment workers of a job: a fixed set of Ray actors that hold the step's episodes.

    pool = EnvironmentPool(spec.environment, topology.environment)    # fails fast: a bad class, no sandbox
    pool.begin()                                                      # per rollout
    ref = pool.step(row, sample, turn)                                # an ObjectRef of an EnvironmentReply
    ref = pool.finish(row, sample, final)
    pool.shutdown()

Episode `row` lives on worker `row % size` for its whole episode (environments hold state). The pool
is the topology's environment group (api/topology.py): `resources.reward.replicas` workers (1 on the
head without a reward pool), each asking for a unit of the reward pool's resource, so on Kubernetes
the environments (and the sandboxed processes their tools start) run in the reward pods. It does not
scale while a job runs: episodes are pinned to their worker. A worker that dies
fails the episodes it held (failed samples); `begin` replaces it before the next rollout.
"""

import logging
from typing import Any

import ray

from kuberl.api import EnvironmentSpec
from kuberl.api.topology import ActorGroup, tool_calls_at_once
from kuberl.runtime.environments.base import ModelTurn
from kuberl.runtime.workers.environment_worker import STEPS_IN_PARALLEL, EnvironmentWorker
from kuberl.runtime.workers.group import ray_actor_options

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 300.0


class EnvironmentPoolError(RuntimeError):
    """The environment workers cannot start; the message says why."""


class EnvironmentPool:
    def __init__(self, environment: EnvironmentSpec, group: ActorGroup) -> None:
        self._manifest = environment.to_manifest()
        self.calls_at_once = tool_calls_at_once(group.cpus)  # tool calls each worker runs at once
        self.size = group.actors
        self._remote: Any = ray.remote(EnvironmentWorker).options(
            **ray_actor_options(group), max_concurrency=STEPS_IN_PARALLEL
        )
        self.workers: list[Any] = []
        self.restarts = 0
        self._rollouts = 0
        try:
            self.workers = [self._start(rank) for rank in range(self.size)]
            setups = [worker.setup.remote(self._manifest, self.calls_at_once) for worker in self.workers]
            ray.get(setups, timeout=SETUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, rank: int) -> Any:
        return self._remote.remote(rank, self.size)

    def begin(self) -> int:
        """Starts a rollout: replaces dead workers, clears leftovers; returns the rollout's id."""
        self._rollouts += 1
        for rank, worker in enumerate(self.workers):
            try:
                ray.get(worker.begin.remote(self._rollouts))
            except ray.exceptions.RayActorError:
                log.warning("environment worker %d died; starting a new one", rank)
                self.restarts += 1
                self.workers[rank] = self._start(rank)
                setup = self.workers[rank].setup.remote(self._manifest, self.calls_at_once)
                ray.get(setup, timeout=SETUP_TIMEOUT_S)
        return self._rollouts

    def step(self, row: int, sample: dict[str, Any], turn: ModelTurn) -> Any:
        return self.workers[row % self.size].step.remote((self._rollouts, row), sample, turn)

    def finish(self, row: int, sample: dict[str, Any], final: ModelTurn) -> Any:
        return self.workers[row % self.size].finish.remote((self._rollouts, row), sample, final)

    def shutdown(self) -> None:
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception as error:  # an actor that is already gone cannot be killed again
                log.debug("environment worker already gone: %s", error)
        self.workers = []
