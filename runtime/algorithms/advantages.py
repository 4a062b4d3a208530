"""Advantage estimators: what every estimator reads, and the statistics they share.

The estimators are pure functions `AdvantageInputs -> (advantages (N, R), returns (N, R))`,
registered under their `AdvantageEstimator` names, in modules by family:
- `group_baselines`: each response against the other responses to its prompt (grpo, rloo, opo,
  gpg, grpo_passk, reinforce_plus_plus_baseline);
- `returns`: per-token returns, with a critic or a batch statistic as baseline (gae,
  reinforce_plus_plus, remax);
Each follows verl's `trainer/ppo/core_algos.py`; its docstring says where it departs.

Conventions every estimator keeps:
- A sample whose reward failed (`scored` False) gets 0 and counts in no statistic: not in its
  group's mean and std, not in a batch whitening, not in a return. A group left with one scored
  member (or none) teaches nothing: its member gets 0. Departure from verl, which has no notion of
  a failed reward and compares the group with the failed sample's placeholder score.
- A group of one by design (groupSize 1, or a caller's own batch) has baseline 0 (and std 1), so
  its advantage is its raw score, as in verl: there is nothing to compare it with.
- The "score" of a response for the outcome estimators is the sum of its valid token rewards,
  so a per-token KL penalty in the reward counts towards it.
- Every output is exactly 0 on padding, and what sits in the padding of the inputs is ignored.

- `token_baselines`: a baseline per token, weighted by the old policy's path variance
  (optimal_token_baseline, tir_optimal_token_baseline); they read the old log-probs and each token's
  sum_v pi(v)^2, which the trainer's old-log-prob pass returns when asked.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """What every estimator may read. N responses, R response tokens (right padded)."""

    token_rewards: Tensor  # (N, R) score on the last response token, plus any per-token KL penalty
    response_mask: Tensor  # (N, R) 1 on real response tokens, 0 on padding
    group_index: Tensor  # (N,) long: equal values answered the same prompt
    values: Tensor | None = None  # (N, R) critic values V(s_t) (gae only)
    baseline_scores: Tensor | None = None  # (N,) score of the greedy response to each sample's prompt (remax only)
    scored: Tensor | None = None  # (N,) bool: the sample's reward succeeded; None means every one did
    old_logprobs: Tensor | None = None  # (N, R) log pi_old of the sampled tokens (token baselines only)
    sum_pi_squared: Tensor | None = None  # (N, R) sum_v pi_old(v)^2 at each token (token baselines only)
    is_weights: Tensor | None = None  # (N, R) truncated importance weights (rolloutCorrection), when there are
    gamma: float = 1.0
    lam: float = 1.0
    normalize_std: bool = True  # grpo: divide by the group std (False = Dr. GRPO)
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.token_rewards.dim() != 2:
            raise ValueError(f"token_rewards must be (N, R); got shape {tuple(self.token_rewards.shape)}")
        n, r = self.token_rewards.shape
        expected = {
            "response_mask": (self.response_mask, (n, r)),
            "group_index": (self.group_index, (n,)),
            "values": (self.values, (n, r)),
            "baseline_scores": (self.baseline_scores, (n,)),
            "scored": (self.scored, (n,)),
            "old_logprobs": (self.old_logprobs, (n, r)),
            "sum_pi_squared": (self.sum_pi_squared, (n, r)),
            "is_weights": (self.is_weights, (n, r)),
        }
        for field, (tensor, shape) in expected.items():
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(
                    f"AdvantageInputs.{field} has shape {tuple(tensor.shape)}, expected {shape} "
                    f"to match token_rewards {(n, r)}"
                )


AdvantageFn = Callable[[AdvantageInputs], tuple[Tensor, Tensor]]  # -> (advantages (N, R), returns (N, R))

#: The inputs every estimator reads; `reads` adds the optional ones (values, baseline_scores).
BASE_READS = frozenset({"token_rewards", "response_mask", "group_index"})


def reads(*optional: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Declare the optional AdvantageInputs an estimator needs, as `estimator.reads`.

    The controller asks this before it spends work on them: `values` needs a critic forward pass,
    `baseline_scores` a greedy rollout of every prompt.
    """
    unknown = set(optional) - {field.name for field in fields(AdvantageInputs)}
    if unknown:
        raise ValueError(f"reads(): {sorted(unknown)} are not AdvantageInputs fields")

    def mark(estimator: AdvantageFn) -> AdvantageFn:
        estimator.reads = BASE_READS | frozenset(optional)  # type: ignore[attr-defined]
        return estimator

    return mark


def estimator_reads(estimator: AdvantageFn) -> frozenset[str]:
    """The AdvantageInputs fields `estimator` reads (see `reads`)."""
    declared: frozenset[str] = getattr(estimator, "reads", BASE_READS)
    return declared


def scored_rows(inputs: AdvantageInputs) -> Tensor:
    """(N,) bool: the samples whose reward succeeded."""
    if inputs.scored is None:
        return torch.ones_like(inputs.group_index, dtype=torch.bool)  # (N,)
    return inputs.scored.bool()  # (N,)


def trained_tokens(inputs: AdvantageInputs) -> Tensor:
    """(N, R) bool: the valid tokens of the samples whose reward succeeded; every statistic counts these only."""
    return inputs.response_mask.bool() & scored_rows(inputs)[:, None]  # (N, R)


@dataclass(frozen=True)
class GroupStats:
    """Per-response statistics of the scored members of the response's group (every field is (N,))."""

    size: Tensor  # (N,) scored members in the response's group
    total: Tensor  # (N,) sum of their scores
    mean: Tensor  # (N,) their mean; 0 for a group of one
    std: Tensor  # (N,) their unbiased std; 1 for a group of one
    learns: Tensor  # (N,) bool: scored, and compared with another scored member (or alone by design)


def sequence_scores(inputs: AdvantageInputs) -> Tensor:
    """Each response's score: the sum of its valid token rewards (0 for a sample whose reward failed)."""
    return torch.where(trained_tokens(inputs), inputs.token_rewards.float(), 0.0).sum(-1)  # (N,)


def group_stats(scores: Tensor, group_index: Tensor, scored: Tensor | None = None) -> GroupStats:
    """Mean and std of the scored members of each response's group, gathered back to the responses."""
    counted = torch.ones_like(scores, dtype=torch.bool) if scored is None else scored.to(scores.device).bool()  # (N,)
    ids, group = torch.unique(group_index, return_inverse=True)  # (G,), (N,) dense group ids 0..G-1
    zeros = scores.new_zeros(ids.numel())  # (G,)
    members = zeros.index_add(0, group, torch.ones_like(scores))[group]  # (N,) scored or not
    weight = counted.to(scores.dtype)  # (N,)
    size = zeros.index_add(0, group, weight)  # (G,)
    total = zeros.index_add(0, group, scores * weight)  # (G,)
    mean = (total / size.clamp(min=1))[group]  # (N,)
    squares = zeros.index_add(0, group, (scores - mean) ** 2 * weight)  # (G,)
    std = (squares / (size - 1).clamp(min=1)).sqrt()[group]  # (N,)
    size = size[group]  # (N,)
    alone = size <= 1  # (N,)
    return GroupStats(
        size=size,
        total=total[group],  # (N,)
        mean=torch.where(alone, 0.0, mean),  # (N,)
        std=torch.where(alone, 1.0, std),  # (N,)
        learns=counted & ((size >= 2) | (members == 1)),  # (N,)
    )


def broadcast_to_tokens(per_response: Tensor, mask: Tensor) -> Tensor:
    """Give every valid token of a response the response's value; padding gets 0."""
    return torch.where(mask.bool(), per_response[:, None], 0.0)  # (N, R)
