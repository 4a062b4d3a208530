"""Policy losses that bound how far one update moves the ratio pi_theta / pi_old: ppo_clip, gspo, geo_mean, sapo.

Each is a registry entry `(PolicyLossInputs, PolicyLossConfig) -> (token loss (n, R), metrics)` and
follows verl's `trainer/ppo/core_algos.py` (compute_policy_loss_vanilla / _gspo / _geo_mean / _sapo):

- ppo_clip: PPO's clipped surrogate max(-A r, -A clip(r, 1 - low, 1 + high)), with dual clip (Ye et
  al., arXiv 1912.09729) bounding negative-advantage tokens by c |A|. As verl.
- gspo: GSPO (Zheng et al., arXiv 2507.18071). The ratio of a response is the geometric mean of its
  token ratios, s_i = exp(mean_t log r_i,t), clipped at sequence level. As verl's "GSPO-token" form:
  log s_i,t = sg[log s_i] + log pi_t - sg[log pi_t], whose value is s_i and whose gradient is
  s_i grad log pi_t, clamped at exp(10). Departure: verl hard-wires seq_mean_token_mean; here a rule
  requires it (api/rules.py), which is the same thing said where the user sees it.
- geo_mean: GMPO (Zhao et al., arXiv 2507.20673). One ratio per response, the geometric mean of the
  token ratios, each clipped in log space to [-low, high] on the side the advantage's sign makes
  harmful; the loss -mean_t(A) * ratio is per response. As verl, including its sign-aware clip and
  its geometric mean of rollout-correction weights. Departures: the length is clamped at 1 instead
  of verl's `+ 1e-8` (the same for any response with a token), and the per-response loss is laid
  on each of its tokens and aggregated by seq_mean_token_mean, which is verl's `torch.mean` over
  responses but with global counts, so it is invariant to sharding.
- sapo: SAPO (Gao et al., arXiv 2511.20347). A soft gate f(r) = sigmoid(tau (r - 1)) * 4 / tau
  replaces the clip, with tau_positive for A > 0 and tau_negative otherwise; the loss is -f(r) A.
  As verl. Departure: verl hard-wires seq_mean_token_mean; here it is sapo's default aggregation
  (api/policy_losses.py) and another may be chosen.

Metrics are means over the micro-batch's valid tokens: approx_kl is k1 of pi_old against pi_theta.
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.losses import (
    PolicyLossConfig,
    PolicyLossInputs,
    importance_weighted,
    log_ratio,
)
from kuberl.runtime.algorithms.masked import masked_mean
from kuberl.runtime.algorithms.registry import POLICY_LOSSES

#: GSPO clamps the log of its sequence ratio here before exp, as verl does.
GSPO_LOG_RATIO_MAX = 10.0


def clipped_surrogate(advantages: Tensor, ratio: Tensor, config: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """PPO's max(-A r, -A clip(r, 1 - low, 1 + high)) per token, and where the clipped term won."""
    unclipped = -advantages * ratio  # (n, R)
    clipped = -advantages * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)  # (n, R)
    return torch.maximum(unclipped, clipped), clipped > unclipped  # (n, R), (n, R)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate, -A * clip(ratio), with dual clip bounding negative-advantage tokens by c * |A|."""
    if config.dual_clip_c is not None and config.dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1 (spec.algorithm.dualClipC); got {config.dual_clip_c}")
    mask, advantages = inputs.mask, inputs.advantages
    log_r = log_ratio(inputs)  # (n, R)
    ratio = torch.exp(log_r)  # (n, R)
    token_loss, clipped = clipped_surrogate(advantages, ratio, config)  # (n, R), (n, R)
    metrics = {
        "clip_fraction": masked_mean(clipped.float(), mask),  # ()
        "approx_kl": masked_mean(-log_r, mask),  # ()
        "ratio_mean": masked_mean(ratio, mask),  # ()
    }
    if config.dual_clip_c is not None:
        bound = -advantages * config.dual_clip_c  # (n, R)
        dual_clipped = (advantages < 0) & (token_loss > bound)  # (n, R)
        token_loss = torch.where(dual_clipped, bound, token_loss)  # (n, R)
        metrics["dual_clip_fraction"] = masked_mean(dual_clipped.float(), mask)  # ()
    return importance_weighted(token_loss, inputs), metrics


def sequence_mean(per_token: Tensor, valid: Tensor) -> Tensor:
    """Each response's mean over its valid tokens (a response without any gets 0)."""
    lengths = valid.sum(-1).clamp(min=1)  # (n,)
    return torch.where(valid, per_token, 0.0).sum(-1) / lengths  # (n,)


@POLICY_LOSSES.register("gspo")
def gspo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """-A * clip(s_i), s_i the length-normalised sequence ratio, in GSPO-token form (see the module docstring)."""
    mask, advantages, logprobs = inputs.mask, inputs.advantages, inputs.logprobs
    valid = mask.bool()  # (n, R)
    log_r = inputs.logprobs - inputs.old_logprobs  # (n, R)
    log_seq_ratio = sequence_mean(log_r, valid)  # (n,) log s_i
    log_s = logprobs - logprobs.detach() + log_seq_ratio.detach()[:, None]  # (n, R) value log s_i, gradient d log pi
    seq_ratio = torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))  # (n, R)
    token_loss, clipped = clipped_surrogate(advantages, seq_ratio, config)  # (n, R), (n, R)
    metrics = {
        "clip_fraction": masked_mean(clipped.float(), mask),  # ()
        "approx_kl": masked_mean(-log_r, mask),  # ()
        "ratio_mean": masked_mean(seq_ratio, mask),  # () token-weighted mean of the sequence ratios
    }
    return importance_weighted(token_loss, inputs), metrics


@POLICY_LOSSES.register("geo_mean")
def geo_mean_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO: -mean_t(A) * exp(mean_t(sign-aware clipped log r)), one loss per response laid on its tokens."""
    mask, advantages = inputs.mask, inputs.advantages
    valid = mask.bool()  # (n, R)
    log_r = inputs.logprobs - inputs.old_logprobs  # (n, R)
    sign = torch.sign(advantages)  # (n, R)
    log_r_clamped = log_r.clamp(-config.clip_low, config.clip_high)  # (n, R)
    # the more pessimistic of the two for the objective: for A > 0 the smaller log-ratio, for A < 0 the larger
    log_r_pessimistic = sign * torch.minimum(sign * log_r, sign * log_r_clamped)  # (n, R)
    seq_ratio = torch.exp(sequence_mean(log_r_pessimistic, valid))  # (n,)
    seq_advantage = sequence_mean(advantages, valid)  # (n,)
    seq_loss = -seq_advantage * seq_ratio  # (n,)
    if inputs.is_weights is not None:  # verl: the geometric mean of the token weights, one per response
        seq_weight = torch.exp(sequence_mean(torch.log(inputs.is_weights + 1e-10), valid))  # (n,)
        seq_loss = seq_loss * seq_weight  # (n,)
    clipped = log_r != log_r_clamped  # (n, R)
    metrics = {
        "clip_fraction": masked_mean((clipped & (advantages > 0)).float(), mask),  # ()
        "clip_fraction_lower": masked_mean((clipped & (advantages < 0)).float(), mask),  # ()
        "approx_kl": masked_mean(-log_r, mask),  # ()
    }
    return seq_loss[:, None].expand_as(log_r), metrics  # (n, R): seq_mean_token_mean makes it one per response


@POLICY_LOSSES.register("sapo")
def sapo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """-f(r) * A with SAPO's soft gate f(r) = sigmoid(tau (r - 1)) * 4 / tau (f(1) = 2/tau, f'(1) = 1)."""
    mask, advantages = inputs.mask, inputs.advantages
    log_r = log_ratio(inputs)  # (n, R)
    ratio = torch.exp(log_r)  # (n, R)
    tau = torch.where(
        advantages > 0, ratio.new_tensor(config.tau_positive), ratio.new_tensor(config.tau_negative)
    )  # (n, R)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)  # (n, R)
    token_loss = -gate * advantages  # (n, R)
    metrics = {
        "approx_kl": masked_mean(-log_r, mask),  # ()
        "ratio_mean": masked_mean(ratio, mask),  # ()
        "gate_mean": masked_mean(gate, mask),  # ()
    }
    return importance_weighted(token_loss, inputs), metrics
