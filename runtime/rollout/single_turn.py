"""The single-turn rollout stage: one response per sample, the prompts split over the engines, one call each.

batch = stage.run(prompts, step)             # groupSize responses per prompt, in prompt order
batch = stage.run(prompts, step, greedy=True, stream=VALIDATION_STREAM)
"""

from typing import Any

import numpy as np
import torch

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.data import Prompt
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.rollout.base import Engines, Sampling, derive_seed


class SingleTurnRollout:
    """One response per sample: the prompts split over the engines, one call each."""

    def __init__(self, sampling: Sampling, tokenizer: Any, engines: Engines, group_size: int, pad_id: int) -> None:
        self.settings = sampling
        self.tokenizer = tokenizer
        self.engines = engines
        self.group_size = group_size
        self.pad_id = pad_id

    def sampling(self, step: int, rank: int, *, greedy: bool = False, stream: int = 0) -> SamplingParams:
        """Sampling of `step` on engine `rank`; `stream` > 0 (another round, validation) draws other seeds."""
        settings = self.settings
        stop_ids = (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        return SamplingParams(
            temperature=0.0 if greedy else settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            max_new_tokens=settings.max_new_tokens,
            n=1 if greedy else self.group_size,
            stop_token_ids=stop_ids,
            stop=settings.stop,
            seed=derive_seed(settings.seed, step, rank, int(greedy), *((stream,) if stream else ())),
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
