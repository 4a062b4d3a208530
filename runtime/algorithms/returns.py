"""Estimators built on per-token returns: gae (with a critic), reinforce_plus_plus, remax.

Registry entries `AdvantageInputs -> (advantages (N, R), returns (N, R))` following verl's
`trainer/ppo/core_algos.py`. Samples whose reward failed get 0 and count in no statistic (their
tokens are left out of every whitening), as every estimator here (see `advantages`).

- gae: Generalised Advantage Estimation (Schulman et al., arXiv 1506.02438) with a critic;
  advantages whitened over the batch's trained tokens. As verl's current version, which skips
  padded steps (the next real step's value and advantage pass through them).
- reinforce_plus_plus: REINFORCE++ (arXiv 2501.03262): discounted returns whitened over the batch.
  As verl.
- remax: ReMax (arXiv 2310.10505): the reward-to-go minus the greedy response's score. As verl.
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.advantages import AdvantageInputs, reads, trained_tokens
from kuberl.runtime.algorithms.masked import masked_whiten
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} over the valid tokens of each response; 0 on masked positions.

    Masked positions are skipped, not counted as steps: the running return passes through them
    undiscounted. On right padding this is verl's REINFORCE++ (nothing follows the padding); it departs
    from verl inside an episode, whose environment tokens are masked: verl resets the return there, so
    the model's earlier messages would get none of the episode's final reward.
    """
    valid = mask.bool()  # (N, R)
    rewards = torch.where(valid, token_rewards.float(), 0.0)  # (N, R)
    returns = torch.zeros_like(rewards)  # (N, R)
    running = torch.zeros_like(rewards[:, 0])  # (N,)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)  # (N,)
        returns[:, t] = torch.where(valid[:, t], running, 0.0)
    return returns


def reward_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """Undiscounted sum of the valid rewards from t to the end of the response; 0 on padding."""
    valid = mask.bool()  # (N, R)
    rewards = torch.where(valid, token_rewards.float(), 0.0)  # (N, R)
    to_go = rewards.flip(-1).cumsum(-1).flip(-1)  # (N, R)
    return torch.where(valid, to_go, 0.0)  # (N, R)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
@reads()
@torch.no_grad()
def reinforce_plus_plus_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    trained = trained_tokens(inputs)  # (N, R)
    returns = discounted_returns(inputs.token_rewards, trained, inputs.gamma)  # (N, R)
    advantages = masked_whiten(returns, trained)  # (N, R)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("remax")
@reads("baseline_scores")
@torch.no_grad()
def remax_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    if inputs.baseline_scores is None:
        raise ValueError(
            "the remax advantage estimator needs the greedy baseline: pass AdvantageInputs.baseline_scores "
            "(the score of each prompt's greedy response)"
        )
    trained = trained_tokens(inputs)  # (N, R)
    returns = reward_to_go(inputs.token_rewards, trained)  # (N, R)
    baseline = inputs.baseline_scores.float()[:, None]  # (N, 1)
    advantages = torch.where(trained, returns - baseline, 0.0)  # (N, R)
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("gae")
@reads("values")
@torch.no_grad()
def gae_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A_t = delta_t + gamma*lam*A_{t+1}, delta_t = r_t + gamma*V_{t+1} - V_t; padding is skipped."""
    if inputs.values is None:
        raise ValueError("the gae advantage estimator needs a critic: pass AdvantageInputs.values")
    valid = trained_tokens(inputs)  # (N, R)
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
