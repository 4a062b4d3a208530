"""The one batch type that carries data between the stages of a step.

N = prompts x groupSize responses in the batch, P = longest prompt, R = longest response.
Prompts are left-padded and responses right-padded, so `cat(prompt_ids, response_ids)` is a
causal-LM input whose response starts at column P for every row.

With an environment (multi-turn) a row's response is a whole episode: the model's messages and the
observations between them. `response_mask` marks the model's tokens only, so everything that trains
or counts (log-probs, advantages, losses, aggregation, metrics) sees the model's tokens and nothing
else; `observation_mask` marks the environment's, which the model attends to (`attention_mask`).

A stage fills the fields it produces; `shard` and `concat` split a batch across the ranks of
a worker group and put the results back together in order.
"""

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    # rollout
    prompt_ids: Tensor  # (N, P) long, left-padded with pad_token_id
    prompt_mask: Tensor  # (N, P) long, 1 on real prompt tokens
    response_ids: Tensor  # (N, R) long, right-padded
    response_mask: Tensor  # (N, R) float, 1 on generated tokens (eos included), 0 on padding and observations
    group_index: Tensor  # (N,) long: responses answering the same prompt share it
    engine_logprobs: Tensor | None = None  # (N, R) log π_rollout of each sampled token, from the engine
    observation_mask: Tensor | None = None  # (N, R) float: 1 on environment tokens inside an episode (multi-turn)
    turn_index: Tensor | None = None  # (N, R) long: a token's turn (1, 2, ...; an observation shares its
    #                                   message's); 0 on padding (multi-turn)
    weight_version: Tensor | None = None  # (N,) long: the weight version (training step) that generated each row
    # reward
    scores: Tensor | None = None  # (N,) sequence reward
    scored: Tensor | None = None  # (N,) bool: the reward succeeded; a failed sample trains nothing
    baseline_scores: Tensor | None = None  # (N,) the greedy response's score for the prompt (remax)
    # trainer forward passes
    old_logprobs: Tensor | None = None  # (N, R) log π_old, the behaviour policy
    ref_logprobs: Tensor | None = None  # (N, R) log π_ref
    values: Tensor | None = None  # (N, R) critic values V(s_t)
    sum_pi_squared: Tensor | None = None  # (N, R) sum_v pi_old(v)^2 at each token (token-baseline estimators)
    # advantages
    token_rewards: Tensor | None = None  # (N, R) score on the last token, minus the KL penalty when in the reward
    advantages: Tensor | None = None  # (N, R)
    returns: Tensor | None = None  # (N, R)
    # what the actor update trains on
    loss_mask: Tensor | None = (
        None  # (N, R) float: response tokens of scored samples, less tokens the correction rejects
    )
    is_weights: Tensor | None = None  # (N, R) truncated importance weights pi_old / pi_engine (rollout correction)
    # not tensors: travel beside the rows, in row order
    texts: list[str] = field(default_factory=list)  # decoded responses, for rewards and logs
    samples: list[dict[str, Any]] = field(default_factory=list)  # each response's dataset record
    #: Rewards an environment gave its episodes (RewardResults; None where spec.reward scores the row).
    environment_rewards: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)  # (N, P+R)

    @property
    def response_attention_mask(self) -> Tensor:
        """(N, R) every real response token: the model's and, in an episode, the environment's."""
        if self.observation_mask is None:
            return self.response_mask
        return self.response_mask + self.observation_mask  # (N, R)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.response_attention_mask.long()], dim=1)  # (N, P+R)

    @property
    def turns(self) -> Tensor:
        """(N,) messages the model wrote in each row: 1 without an environment."""
        if self.turn_index is None:
            return torch.ones(len(self), dtype=torch.long)  # (N,)
        return self.turn_index.max(-1).values  # (N,)

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(-1)  # (N,)

    def tensor_fields(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}

    def select(self, rows: Tensor | list[int] | slice) -> "RolloutBatch":
        """The rows `rows` of every field, in that order."""
        index = rows if isinstance(rows, slice) else torch.as_tensor(rows, dtype=torch.long)
        picked: dict[str, Any] = {name: value[index] for name, value in self.tensor_fields().items()}
        positions = range(len(self))[index] if isinstance(index, slice) else index.tolist()
        picked["texts"] = [self.texts[i] for i in positions] if self.texts else []
        picked["samples"] = [self.samples[i] for i in positions] if self.samples else []
        rewards = self.environment_rewards
        picked["environment_rewards"] = [rewards[i] for i in positions] if rewards else []
        return replace(self, **picked)

    def shard(self, parts: int) -> list["RolloutBatch"]:
        """`parts` contiguous shards, sizes differing by at most one (rank r gets shard r)."""
        bounds = torch.linspace(0, len(self), parts + 1).round().long().tolist()
        return [self.select(slice(bounds[i], bounds[i + 1])) for i in range(parts)]

    @staticmethod
    def concat(batches: list["RolloutBatch"]) -> "RolloutBatch":
        """Rows of `batches` one after another; tensors padded to the widest P and R first."""
        first = batches[0]
        width_p = max(b.prompt_ids.shape[1] for b in batches)
        width_r = max(b.response_ids.shape[1] for b in batches)
        merged: dict[str, Any] = {}
        for name, value in first.tensor_fields().items():
            parts = [getattr(b, name) for b in batches]
            if any(p is None for p in parts):
                raise ValueError(f"cannot concat batches where only some carry {name}")
            if value.dim() == 2:
                width = width_p if name.startswith("prompt") else width_r
                left = name.startswith("prompt")  # prompts are left-padded
                parts = [_pad_columns(p, width, left=left) for p in parts]
            merged[name] = torch.cat(parts, dim=0)
        merged["texts"] = [t for b in batches for t in b.texts]
        merged["samples"] = [s for b in batches for s in b.samples]
        merged["environment_rewards"] = [r for b in batches for r in b.environment_rewards]
        return replace(first, **merged)


def _pad_columns(tensor: Tensor, width: int, *, left: bool) -> Tensor:
    """Zero columns on the padding side: masks say they are padding, so their ids never matter."""
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    pad = torch.zeros((tensor.shape[0], missing), dtype=tensor.dtype)
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)
