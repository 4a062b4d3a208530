"""The rollout stage: prompts in, a RolloutBatch of responses out, on the job's generation engines.

    stage = rollout_stage(plan, groups)          # chosen by configuration, never by algorithm
    batch = stage.run(prompts, step)             # groupSize responses per prompt, in prompt order
    batch = stage.run(prompts, step, greedy=True, stream=VALIDATION_STREAM)

Two stages, one interface: `SingleTurnRollout` (one response per sample, the default) and, when
spec.environment is set, `EpisodeRollout` (runtime/environments/rollout.py: multi-turn episodes).
The controller calls `run` for training rollouts, validation and the greedy baseline alike and
never asks which one it holds.
"""

from typing import Any, Protocol

import numpy as np
import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.deadline import bounded_get
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.rollout_pool import ChunkWork, RolloutPool

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

    A step's prompts are cut into `shards` parts, part r sampled with the seeds of rank r: on the actor's
    ranks, part r goes to rank r; in the separate pool, to whichever replica is free (rollout_pool.py), so
    the samples do not depend on how many replicas the pool has at the moment.
    """

    def __init__(self, actor: Any, rollout: RolloutPool | None) -> None:
        self.separate = rollout is not None
        self.actor = actor
        self.pool = rollout
        self.colocated_version = 0  # the weights the actor's ranks hold (colocated)

    @property
    def version(self) -> int:
        """The weights the engines hold: every replica the separate pool hands a chunk to holds the pool's."""
        return self.pool.version if self.pool is not None else self.colocated_version

    @property
    def shards(self) -> int:
        return self.pool.chunks if self.pool is not None else int(self.actor.world_size)

    @property
    def size(self) -> int:
        """Engines a caller may `submit` to: the actor's ranks, or the pool's replicas holding its weights."""
        return len(self.pool.replicas()) if self.pool is not None else int(self.actor.world_size)

    def submit(self, rank: int, prompts: list[list[int]], params: SamplingParams) -> Any:
        """One generation call on engine `rank` (of `size`); an ObjectRef of list[list[Generation]]."""
        if self.pool is not None:
            replica = list(self.pool.replicas().values())[rank]
            return replica.generate.remote(prompts, params, self.pool.version)
        return self.actor.workers[rank].generate.remote(prompts, params)

    def sleep(self) -> dict[str, float]:
        """Colocated: every actor rank's engine gives its device memory to the trainer until the sync wakes it
        (ModelWorker.sleep_engine; nothing is freed off the GPU). A separate pool's engines never sleep."""
        if self.pool is not None:
            return {}
        freed = [result["engine/sleep_freed_bytes"] for result in self.actor.call("sleep_engine")]
        return {"engine/sleep_freed_bytes": sum(freed) / len(freed)}  # per rank, each on a GPU of its own

    def generate(self, work: list[ChunkWork]) -> list[tuple[list[list[Generation]], int]]:
        """Each shard's generations and the weight version that made them, in shard order."""
        if self.pool is not None:
            return [(chunk.generations, chunk.version) for chunk in self.pool.generate(work)]
        calls = [self.actor.workers[rank].generate.remote(*shard) for rank, shard in enumerate(work)]
        parts = bounded_get(calls, f"generate on the {self.actor.group.name} workers")
        return [(part, self.colocated_version) for part in parts]


class SingleTurnRollout:
    """One response per sample: the prompts split over the engines, one call each."""

    def __init__(self, spec: Any, tokenizer: Any, engines: Engines, group_size: int, pad_id: int) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.engines = engines
        self.group_size = group_size
        self.pad_id = pad_id

    def sampling(self, step: int, rank: int, *, greedy: bool = False, stream: int = 0) -> SamplingParams:
        """Sampling of `step` on engine `rank`; `stream` > 0 (another round, validation) draws other seeds."""
        rollout = self.spec.rollout
        stop_ids = (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        return SamplingParams(
            temperature=0.0 if greedy else rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=rollout.max_new_tokens,
            n=1 if greedy else self.group_size,
            stop_token_ids=stop_ids,
            stop=tuple(rollout.stop),
            seed=derive_seed(self.spec.training.seed, step, rank, int(greedy), *((stream,) if stream else ())),
        )

    def generate(
        self, prompts: list[Prompt], step: int, greedy: bool = False, stream: int = 0
    ) -> tuple[list[list[Generation]], list[int]]:
        """Each prompt's generations, and the weight version that generated them."""
        shards = np.array_split(np.arange(len(prompts)), self.engines.shards)
        work = [
            ([prompts[i].input_ids for i in shard], self.sampling(step, rank, greedy=greedy, stream=stream))
            for rank, shard in enumerate(shards)
        ]
        parts = self.engines.generate(work)
        generations = [gens for part, _ in parts for gens in part]
        versions = [version for part, version in parts for _ in part]
        return generations, versions

    def run(
        self, prompts: list[Prompt], step: int, *, greedy: bool = False, stream: int = 0, record: bool = True
    ) -> RolloutBatch:
        generations, versions = self.generate(prompts, step, greedy=greedy, stream=stream)
        rows = [(p, g) for p, gens in zip(prompts, generations, strict=True) for g in gens]
        row_versions = [version for version, gens in zip(versions, generations, strict=True) for _ in gens]
        width_p = max(len(p.input_ids) for p, _ in rows)
        width_r = max(1, max(len(g.token_ids) for _, g in rows))
        n = len(rows)
        prompt_ids = torch.full((n, width_p), self.pad_id, dtype=torch.long)  # (N, P)
        prompt_mask = torch.zeros((n, width_p), dtype=torch.long)  # (N, P)
        response_ids = torch.full((n, width_r), self.pad_id, dtype=torch.long)  # (N, R)
        response_mask = torch.zeros((n, width_r))  # (N, R)
        engine_logprobs = torch.zeros((n, width_r))  # (N, R)
        for row, (prompt, gen) in enumerate(rows):
            length_p, length_r = len(prompt.input_ids), len(gen.token_ids)
            prompt_ids[row, width_p - length_p :] = torch.tensor(prompt.input_ids)
            prompt_mask[row, width_p - length_p :] = 1
            if length_r:
                response_ids[row, :length_r] = torch.tensor(gen.token_ids)
                response_mask[row, :length_r] = 1
                engine_logprobs[row, :length_r] = torch.tensor(gen.logprobs)
        per_prompt = 1 if greedy else self.group_size
        group_index = torch.arange(len(prompts)).repeat_interleave(per_prompt)  # (N,)
        texts = [self.tokenizer.decode(g.token_ids, skip_special_tokens=True) for _, g in rows]
        return RolloutBatch(
            prompt_ids,
            prompt_mask,
            response_ids,
            response_mask,
            group_index,
            engine_logprobs=engine_logprobs,
            texts=texts,
            samples=[p.record for p, _ in rows],
            weight_version=torch.tensor(row_versions, dtype=torch.long),  # (N,)
        )

    def take_metrics(self) -> dict[str, float]:
        return {}


def rollout_stage(plan: Any, groups: Any, engines: Engines) -> RolloutStage:
    """Episodes when the job has an environment (groups.environment), one response per sample otherwise."""
    spec = plan.job.spec
    group_size = spec.algorithm.group_size or 1
    pad_id = plan.tokenizer.pad_token_id if plan.tokenizer.pad_token_id is not None else 0
    if groups.environment is None:
        return SingleTurnRollout(spec, plan.tokenizer, engines, group_size, pad_id)
    from kuberl.runtime.environments.rollout import EpisodeRollout

    return EpisodeRollout(spec, plan.tokenizer, engines, groups.environment, group_size, pad_id)
