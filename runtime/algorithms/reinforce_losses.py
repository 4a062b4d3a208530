"""Policy losses of the REINFORCE form -w * A * log pi_theta, whose gradient is w * A * grad log pi: gpg, cispo.

Registry entries `(PolicyLossInputs, PolicyLossConfig) -> (token loss (n, R), metrics)`, following
verl's `trainer/ppo/core_algos.py` (compute_policy_loss_gpg / _cispo):

- gpg: GPG (Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
  Reasoning", arXiv 2504.02546): plain policy gradient, no ratio and no clip; its estimator (the
  `gpg` advantage estimator) carries the paper's correction. As verl; the behaviour log-probs are
  not read, so GPG is exactly on-policy only with one epoch over one mini-batch.
- cispo: CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): the importance weight r = pi / pi_old is
  clipped to [1 - low, 1 + high] and detached; no token ever loses its gradient (PPO's clip drops
  the rare "fork" tokens). `clipRatioLow: 1` removes the lower bound, as the paper does. As verl.

The loss values are not the surrogate's (log pi is negative), only their gradients are; the
rollout-correction weights multiply the token loss, as in verl.
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.losses import PolicyLossConfig, PolicyLossInputs, importance_weighted, log_ratio
from kuberl.runtime.algorithms.masked import masked_mean
from kuberl.runtime.algorithms.registry import POLICY_LOSSES


@POLICY_LOSSES.register("gpg")
def gpg_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """-A * log pi_theta."""
    token_loss = -inputs.logprobs * inputs.advantages  # (n, R)
    metrics = {"approx_kl": masked_mean(inputs.old_logprobs - inputs.logprobs.detach(), inputs.mask)}  # ()
    return importance_weighted(token_loss, inputs), metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """-sg(clip(r, 1 - low, 1 + high)) * A * log pi_theta."""
    log_r = log_ratio(inputs)  # (n, R)
    ratio = torch.exp(log_r)  # (n, R)
    weight = ratio.clamp(1 - config.clip_low, 1 + config.clip_high).detach()  # (n, R)
    token_loss = -weight * inputs.advantages * inputs.logprobs  # (n, R)
    metrics = {
        "clip_fraction": masked_mean((ratio != weight).float(), inputs.mask),  # ()
        "approx_kl": masked_mean(-log_r, inputs.mask),  # ()
        "ratio_mean": masked_mean(ratio, inputs.mask),  # ()
    }
    return importance_weighted(token_loss, inputs), metrics
