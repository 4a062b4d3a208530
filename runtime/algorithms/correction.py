"""Rollout correction: importance weights of the trainer's policy against the engine's, truncated and/or masked.

A pure function of two log-prob tensors, so any driver can use it: the synchronous loop compares the
trainer's behaviour log-probs with the engine's (spec.algorithm.rolloutCorrection), and an
asynchronous driver can compare the current policy with the stale one that sampled.

`rollout_correction(trainer, engine, mask, config)` returns
- `weights` (truncated importance sampling, TIS): w = exp(log pi_trainer - log pi_engine) per token,
  or per response exp(sum_t ...) broadcast to its tokens, truncated at `is_threshold`, detached;
- `keep` (masked importance sampling, MIS): False on a token whose weight, or a response whose
  weight product (sequence) / geometric mean (geometric), lies outside [low, high];
- metrics: the share of tokens truncated and rejected, the share of responses touched, and the
  mean |log w| (how far the two policies are apart).

Follows verl's `trainer/ppo/rollout_corr_helper.py` (compute_rollout_correction_weights and
compute_rollout_rejection_mask): log-space, the same +-20 bound before exp, truncation measured
before it is applied, detached weights. Departures: no batch normalisation of the weights and no
per-token veto; a rejected token stays in the loss's denominators (it contributes 0), so the
correction never changes the weight of another token and the loss stays invariant to sharding.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from kuberl.runtime.algorithms.devices import check_same_device
from kuberl.runtime.algorithms.masked import masked_mean, masked_sum

#: As verl's SAFETY_BOUND: exp(20) ~ 4.9e8 is the largest weight ever formed.
LOG_WEIGHT_BOUND = 20.0


@dataclass(frozen=True)
class CorrectionConfig:
    importance_sampling: str | None  # "token" | "sequence" | None
    is_threshold: float  # truncate weights above this
    rejection: str | None  # "token" | "sequence" | "geometric" | None
    rejection_low: float  # keep weights in [low, high]
    rejection_high: float


@dataclass(frozen=True)
class Correction:
    weights: Tensor | None  # (n, R) truncated weights, detached, 0 on padding; None without importance sampling
    keep: Tensor  # (n, R) bool: True where the token stays in the loss (always False on padding)
    metrics: dict[str, Tensor]  # () each: token shares, or response shares as named


def _level_log_weights(log_w: Tensor, valid: Tensor, level: str) -> Tensor:
    """Per-token log-weights at a level: the token's own, or its response's sum (sequence) or mean (geometric)."""
    if level == "token":
        return log_w  # (n, R)
    if level == "sequence":
        return masked_sum(log_w, valid, dim=-1)[:, None].expand_as(log_w)  # (n, R)
    if level == "geometric":
        return masked_mean(log_w, valid, dim=-1)[:, None].expand_as(log_w)  # (n, R)
    raise ValueError(f"unknown rollout-correction level {level!r}; use token, sequence or geometric")


def rollout_correction(
    trainer_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, config: CorrectionConfig
) -> Correction:
    """Importance weights pi_trainer / pi_engine of the sampled tokens, truncated and/or masked (see the module)."""
    check_same_device(
        "rollout_correction", trainer_logprobs=trainer_logprobs, engine_logprobs=engine_logprobs, mask=mask
    )
    valid = mask.bool()  # (n, R)
    log_w = torch.where(valid, trainer_logprobs.detach().float() - engine_logprobs.float(), 0.0)  # (n, R)
    touched_rows = valid.any(-1)  # (n,) responses with a token
    metrics = {"log_weight_abs_mean": masked_mean(log_w.abs(), valid)}  # ()
    weights = None
    if config.importance_sampling is not None:
        level_log_w = _level_log_weights(log_w, valid, config.importance_sampling)  # (n, R)
        raw = torch.exp(level_log_w.clamp(-LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))  # (n, R)
        truncated = valid & (raw > config.is_threshold)  # (n, R)
        weights = torch.where(valid, raw.clamp(max=config.is_threshold), 0.0)  # (n, R)
        metrics["is_weight_mean"] = masked_mean(weights, valid)  # ()
        metrics["is_truncated_fraction"] = masked_mean(truncated.float(), valid)  # ()
        metrics["is_truncated_response_fraction"] = masked_mean(truncated.any(-1).float(), touched_rows)  # ()
    keep = valid
    if config.rejection is not None:
        level_log_w = _level_log_weights(log_w, valid, config.rejection)  # (n, R)
        # compared in log space: a weight of e^30 is outside the bounds even though exp would clamp it to e^20
        inside = (level_log_w >= math.log(config.rejection_low)) & (
            level_log_w <= math.log(config.rejection_high)
        )  # (n, R)
        keep = valid & inside  # (n, R)
        rejected = valid & ~inside  # (n, R)
        metrics["rejected_fraction"] = masked_mean(rejected.float(), valid)  # ()
        metrics["rejected_response_fraction"] = masked_mean(rejected.any(-1).float(), touched_rows)  # ()
    return Correction(weights=weights, keep=keep, metrics=metrics)
