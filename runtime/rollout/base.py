"""What every rollout stage shares: the stage's interface, the engines it generates on, and its seeds.

Two stages, one interface (`RolloutStage`): `SingleTurnRollout` (single_turn.py: one response per sample, the
default) and, when spec.environment is set, `EpisodeRollout` (episodes.py: multi-turn episodes). The controller
calls `run` for training rollouts, validation and the greedy baseline alike and never asks which one it holds;
`rollout_stage` (this package's __init__) picks one by configuration, never by algorithm.
"""

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.deadline import bounded_get
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.pools.rollout import ChunkWork, RolloutPool


@dataclass(frozen=True)
class Sampling:
    """How the rollout samples (spec.rollout) and the seed every draw derives from (spec.training.seed)."""

    temperature: float
    top_p: float
    top_k: int | None
    max_new_tokens: int  # of one response, or of one message of an episode (spec.rollout.maxNewTokens)
    stop: tuple[str, ...]
    seed: int


#: Seed streams of generation beyond a step's first rollout (the first keeps its historical seeds).
VALIDATION_STREAM = 1 << 20


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, step, rank, ...): runs replay, streams do not collide."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


class RolloutStage(Protocol):
    def run(
        self, prompts: list[Prompt], step: int, *, greedy: bool = False, stream: int = 0, record: bool = True
    ) -> RolloutBatch:
        """n responses (1 greedy, else groupSize) to each prompt, rows in prompt order.

        `record`: count this rollout in the step's metrics (`take_metrics`); validation and baselines do not.
        """
        ...

    def take_metrics(self) -> dict[str, float]:
        """What the recorded rollouts since the last call measured (and forget it)."""
        ...


class Engines:
    """The job's generation engines: the actor's ranks (colocated) or the rollout pool's replicas (separate).

    A step's prompts are cut into `shards` parts, part r sampled with the seeds of shard r: on the actor's
    ranks, part r goes to the engine of rank r, or with a colocated engine split over `split` ranks
    (rollout.tensorParallelSize) to every rank of group r, which generate it together and answer alike (the first
    rank's answer is kept); in the separate pool, to whichever replica is free (rollout_pool.py), so the samples
    do not depend on how many replicas the pool has at the moment.
    """

    def __init__(self, actor: Any, rollout: RolloutPool | None, split: int = 1) -> None:
        self.separate = rollout is not None
        self.actor = actor
        self.pool = rollout
        self.split = 1 if rollout is not None else split  # actor ranks one colocated engine spans
        self.colocated_version = 0  # the weights the actor's ranks hold (colocated)

    @property
    def version(self) -> int:
        """The weights the engines hold: every replica the separate pool hands a chunk to holds the pool's."""
        return self.pool.version if self.pool is not None else self.colocated_version

    @property
    def shards(self) -> int:
        return self.pool.chunks if self.pool is not None else int(self.actor.world_size) // self.split

    @property
    def size(self) -> int:
        """Engines a caller may `submit` to: the actor's engines, or the pool's replicas holding its weights."""
        return len(self.pool.replicas()) if self.pool is not None else int(self.actor.world_size) // self.split

    def submit(self, rank: int, prompts: list[list[int]], params: SamplingParams) -> Any:
        """One generation call on engine `rank` (of `size`); an ObjectRef of list[list[Generation]]."""
        if self.pool is not None:
            replica = list(self.pool.replicas().values())[rank]
            return replica.generate.remote(prompts, params, self.pool.version)
        if self.split > 1:  # api/rules.py refuses episodes with a split colocated engine
            raise RuntimeError("a colocated engine split over ranks takes whole shards (Engines.generate) only")
        return self.actor.workers[rank].generate.remote(prompts, params)

    def generate(self, work: list[ChunkWork]) -> list[tuple[list[list[Generation]], int]]:
        """Each shard's generations and the weight version that made them, in shard order."""
        if self.pool is not None:
            return [(chunk.generations, chunk.version) for chunk in self.pool.generate(work)]
        calls = [worker.generate.remote(*work[rank // self.split]) for rank, worker in enumerate(self.actor.workers)]
        parts = bounded_get(calls, f"generate on the {self.actor.group.name} workers")
        return [(parts[shard * self.split], self.colocated_version) for shard in range(len(work))]

    def sleep(self) -> dict[str, float]:
        """Colocated: every actor rank's engine gives its device memory to the trainer until the sync wakes it
        (ModelWorker.sleep_engine; nothing is freed off the GPU). A separate pool's engines never sleep."""
        if self.pool is not None:
            return {}
        freed = [result["engine/sleep_freed_bytes"] for result in self.actor.call("sleep_engine")]
        return {"engine/sleep_freed_bytes": sum(freed) / len(freed)}  # per rank, each on a GPU of its own
