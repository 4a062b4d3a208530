"""Advantage estimators: pure functions from per-token rewards (and values) to advantages and returns.

Each estimator is registered under its `AdvantageEstimator` name and follows verl's
`trainer/ppo/core_algos.py`:

- gae: Generalised Advantage Estimation (Schulman et al., arXiv 1506.02438) with a critic;
  advantages whitened over the batch's valid tokens.
- grpo: DeepSeekMath (arXiv 2402.03300), outcome supervision: each response's score minus its
  group's mean, divided by the group's (unbiased) std unless `normalize_std` is False (Dr. GRPO,
  arXiv 2503.20783).
- rloo: REINFORCE leave-one-out (Ahmadian et al., arXiv 2402.14740).
- reinforce_plus_plus: REINFORCE++ (arXiv 2501.03262): discounted returns whitened over the batch.
- reinforce_plus_plus_baseline: group-mean baseline, then whitened over the batch.
- remax: ReMax (arXiv 2310.10505): the greedy response's score as baseline.

Conventions that differ from the papers, as in verl:
- A group of one (a prompt whose other responses were filtered out) has baseline 0 (and std 1 for
  grpo), so its advantage is its raw score: there is nothing to compare it with.
- The "score" of a response for the outcome estimators is the sum of its valid token rewards,
  so a per-token KL penalty in the reward counts towards it.
- Every output is exactly 0 on padding, and what sits in the padding of the inputs is ignored.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from kuberl.runtime.algorithms.masked import masked_whiten
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS


@dataclass(frozen=True)
class AdvantageInputs:
    """What every estimator may read. N responses, R response tokens (right padded)."""

    token_rewards: Tensor  # (N, R) score on the last response token, plus any per-token KL penalty
    response_mask: Tensor  # (N, R) 1 on real response tokens, 0 on padding
    group_index: Tensor  # (N,) long: equal values answered the same prompt
    values: Tensor | None = None  # (N, R) critic values V(s_t) (gae only)
    baseline_scores: Tensor | None = None  # (N,) score of the greedy response to each sample's prompt (remax only)
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


@dataclass(frozen=True)
class GroupStats:
    """Per-response statistics of the response's group (every field is (N,))."""

    size: Tensor  # (N,) members in the response's group
    total: Tensor  # (N,) sum of the group's scores
    mean: Tensor  # (N,) group mean; 0 for a group of one
    std: Tensor  # (N,) unbiased group std; 1 for a group of one


def sequence_scores(inputs: AdvantageInputs) -> Tensor:
    """Each response's score: the sum of its valid token rewards."""
    valid = inputs.response_mask.bool()  # (N, R)
    return torch.where(valid, inputs.token_rewards.float(), 0.0).sum(-1)  # (N,)


def group_stats(scores: Tensor, group_index: Tensor) -> GroupStats:
    """Mean and std of each response's group, gathered back to the responses."""
    ids, group = torch.unique(group_index, return_inverse=True)  # (G,), (N,) dense group ids 0..G-1
    zeros = scores.new_zeros(ids.numel())  # (G,)
    size = zeros.index_add(0, group, torch.ones_like(scores))  # (G,)
    total = zeros.index_add(0, group, scores)  # (G,)
    mean = (total / size)[group]  # (N,)
    squares = zeros.index_add(0, group, (scores - mean) ** 2)  # (G,)
    std = (squares / (size - 1).clamp(min=1)).sqrt()[group]  # (N,)
    size = size[group]  # (N,)
    alone = size == 1  # (N,)
    return GroupStats(
        size=size,
        total=total[group],  # (N,)
        mean=torch.where(alone, 0.0, mean),  # (N,)
        std=torch.where(alone, 1.0, std),  # (N,)
    )


def broadcast_to_tokens(per_response: Tensor, mask: Tensor) -> Tensor:
    """Give every valid token of a response the response's value; padding gets 0."""
    return torch.where(mask.bool(), per_response[:, None], 0.0)  # (N, R)


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} within each response.

    As in verl's REINFORCE++, the running return is reset at every masked position, so padding
    (and, in multi-turn data, a masked span) never carries reward to the tokens before it.
    """
    valid = mask.bool()  # (N, R)
    rewards = torch.where(valid, token_rewards.float(), 0.0)  # (N, R)
    returns = torch.zeros_like(rewards)  # (N, R)
    running = torch.zeros_like(rewards[:, 0])  # (N,)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, 0.0)  # (N,)
        returns[:, t] = running
    return returns


def reward_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Undiscounted sum of the valid rewards from t to the end of the response; 0 on padding."""
    valid = mask.bool()  # (N, R)
    rewards = torch.where(valid, token_rewards.float(), 0.0)  # (N, R)
    to_go = rewards.flip(-1).cumsum(-1).flip(-1)  # (N, R)
    return torch.where(valid, to_go, 0.0)  # (N, R)


@ADVANTAGE_ESTIMATORS.register("grpo")
@reads()
@torch.no_grad()
def grpo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index)
    centred = scores - stats.mean  # (N,)
    per_response = centred / (stats.std + inputs.eps) if inputs.normalize_std else centred  # (N,)
    advantages = broadcast_to_tokens(per_response, inputs.response_mask)  # (N, R)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("rloo")
@reads()
@torch.no_grad()
def rloo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """s_i minus the mean of the other members of its group; a group of one keeps s_i (verl's choice)."""
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index)
    others_mean = (stats.total - scores) / (stats.size - 1).clamp(min=1)  # (N,)
    per_response = torch.where(stats.size > 1, scores - others_mean, scores)  # (N,)
    advantages = broadcast_to_tokens(per_response, inputs.response_mask)  # (N, R)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
@reads()
@torch.no_grad()
def reinforce_plus_plus_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    returns = discounted_returns(inputs.token_rewards, inputs.response_mask, inputs.gamma)  # (N, R)
    advantages = masked_whiten(returns, inputs.response_mask)  # (N, R)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@reads()
@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index)
    centred = broadcast_to_tokens(scores - stats.mean, inputs.response_mask)  # (N, R)
    advantages = masked_whiten(centred, inputs.response_mask)  # (N, R)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("remax")
@reads("baseline_scores")
@torch.no_grad()
def remax_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    if inputs.baseline_scores is None:
        raise ValueError(
            "the remax advantage estimator needs the greedy baseline: pass AdvantageInputs.baseline_scores "
            "(the score of each prompt's greedy response)"
        )
    returns = reward_to_go(inputs.token_rewards, inputs.response_mask)  # (N, R)
    baseline = inputs.baseline_scores.float()[:, None]  # (N, 1)
    advantages = torch.where(inputs.response_mask.bool(), returns - baseline, 0.0)  # (N, R)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("gae")
@reads("values")
@torch.no_grad()
def gae_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A_t = delta_t + gamma*lam*A_{t+1}, delta_t = r_t + gamma*V_{t+1} - V_t; padding is skipped."""
    if inputs.values is None:
        raise ValueError("the gae advantage estimator needs a critic: pass AdvantageInputs.values")
    valid = inputs.response_mask.bool()  # (N, R)
    rewards = torch.where(valid, inputs.token_rewards.float(), 0.0)  # (N, R)
    values = torch.where(valid, inputs.values.float(), 0.0)  # (N, R)
    raw = torch.zeros_like(rewards)  # (N, R)
    next_value = torch.zeros_like(rewards[:, 0])  # (N,)
    next_advantage = torch.zeros_like(rewards[:, 0])  # (N,)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + inputs.gamma * next_value - values[:, t]  # (N,)
        advantage = delta + inputs.gamma * inputs.lam * next_advantage  # (N,)
        # A padded step passes the next real step's value and advantage through unchanged.
        next_value = torch.where(valid[:, t], values[:, t], next_value)  # (N,)
        next_advantage = torch.where(valid[:, t], advantage, next_advantage)  # (N,)
        raw[:, t] = next_advantage
    returns = torch.where(valid, raw + values, 0.0)  # (N, R)
    advantages = masked_whiten(raw, valid)  # (N, R)
    return advantages, returns
