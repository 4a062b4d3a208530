"""Policy losses that act on the few tokens whose advantage and log-prob move together most: clip_cov, kl_cov.

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (arXiv
2505.22617) trace entropy collapse to tokens with a large covariance between log pi and A; these two
losses restrain just those. Registry entries `(PolicyLossInputs, PolicyLossConfig) -> (token loss,
metrics)`, following verl's `compute_policy_loss_clip_cov` / `_kl_cov`:

- clip_cov: PPO's clipped surrogate, except that `ratio` of the tokens (at least one) are drawn at
  random among those the clip left alone with covariance in (lowerBound, upperBound), and lose
  their gradient (their loss is set to 0).
- kl_cov: the unclipped surrogate -A r, plus coef * |log r| on the `ratio` of tokens (at least one)
  with the largest covariance.

Covariance here is cov_t = (A_t - mean A) (log pi_t - mean log pi) over the micro-batch's valid
tokens, as in verl. Departures:
- the draw of clip_cov comes from a generator seeded with `PolicyLossInputs.seed`, not torch's
  global generator, so a run (and its resume) replays;
- the log-ratio is clamped to +-20 before exp, as every other loss here (verl leaves it unclamped
  for these two; the results differ only where the ratio would overflow).
As in verl, the selection is made within each micro-batch: unlike every other loss, these two are
not invariant to the micro-batch size (the share of tokens chosen is).
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.clipped_surrogates import clipped_surrogate
from kuberl.runtime.algorithms.losses import PolicyLossConfig, PolicyLossInputs, importance_weighted, log_ratio
from kuberl.runtime.algorithms.masked import masked_mean
from kuberl.runtime.algorithms.registry import POLICY_LOSSES


def advantage_logprob_covariance(inputs: PolicyLossInputs) -> Tensor:
    """(A_t - mean A) * (log pi_t - mean log pi) per token, means over the valid tokens; detached."""
    valid = inputs.mask.bool()  # (n, R)
    logprobs = inputs.logprobs.detach()  # (n, R)
    centred_advantages = inputs.advantages - masked_mean(inputs.advantages, valid)  # (n, R)
    return centred_advantages * (logprobs - masked_mean(logprobs, valid))  # (n, R)


def share_of(count: int, ratio: float) -> int:
    """How many of `count` tokens a ratio picks: at least one (verl's max(int(ratio * count), 1))."""
    return max(int(ratio * count), 1)


@POLICY_LOSSES.register("clip_cov")
def clip_cov_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    mask, advantages = inputs.mask, inputs.advantages
    valid = mask.bool()  # (n, R)
    log_r = log_ratio(inputs)  # (n, R)
    surrogate, clipped = clipped_surrogate(advantages, torch.exp(log_r), config)  # (n, R), (n, R)
    clipped_by_ratio = clipped & valid  # (n, R)
    covariance = advantage_logprob_covariance(inputs)  # (n, R)
    in_band = (covariance > config.clip_cov_lower) & (covariance < config.clip_cov_upper)  # (n, R)
    candidates = torch.nonzero((valid & ~clipped_by_ratio & in_band).flatten()).flatten()  # (C,) flat indices
    picks = share_of(int(valid.sum()), config.clip_cov_ratio)
    generator = torch.Generator().manual_seed(inputs.seed)
    order = torch.randperm(candidates.numel(), generator=generator).to(candidates.device)  # (C,)
    detached = torch.zeros_like(valid).flatten()  # (n*R,)
    detached[candidates[order[:picks]]] = True
    detached = detached.view_as(valid)  # (n, R)
    token_loss = torch.where(detached, 0.0, surrogate)  # (n, R)
    metrics = {
        "clip_fraction": masked_mean(clipped_by_ratio.float(), mask),  # ()
        "cov_clip_fraction": masked_mean(detached.float(), mask),  # ()
        "approx_kl": masked_mean(-log_r, mask),  # ()
    }
    return importance_weighted(token_loss, inputs), metrics


@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    mask, advantages = inputs.mask, inputs.advantages
    valid = mask.bool()  # (n, R)
    log_r = log_ratio(inputs)  # (n, R)
    surrogate = -advantages * torch.exp(log_r)  # (n, R)
    penalised = surrogate + config.kl_cov_coef * log_r.abs()  # (n, R)
    selected = torch.zeros_like(valid).flatten()  # (n*R,)
    valid_index = torch.nonzero(valid.flatten()).flatten()  # (T,)
    if valid_index.numel():
        covariance = advantage_logprob_covariance(inputs).flatten()[valid_index]  # (T,)
        top = torch.topk(covariance, share_of(valid_index.numel(), config.kl_cov_ratio)).indices  # (k,)
        selected[valid_index[top]] = True
    selected = selected.view_as(valid)  # (n, R)
    token_loss = torch.where(selected, penalised, surrogate)  # (n, R)
    metrics = {
        "approx_kl": masked_mean(-log_r, mask),  # ()
        "abs_kl": masked_mean(log_r.abs(), mask),  # ()
        "kl_cov_fraction": masked_mean(selected.float(), mask),  # ()
    }
    return importance_weighted(token_loss, inputs), metrics
