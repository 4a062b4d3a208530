"""Actor and critic losses, and the one function that turns token losses into a scalar.

Loss aggregation (`spec.algorithm.lossAggregation`) lives in `aggregate_loss` alone, so every
loss is invariant to how the batch is sharded. Each data-parallel rank (and each micro-batch of
gradient accumulation) passes the counts of the whole mini-batch as `global_tokens` /
`global_seqs`; the aggregates of the shards then *sum* to the aggregate of the unsharded batch.
The caller therefore sums micro-batch losses (no division by their number), and, since FSDP's
gradient all-reduce averages over ranks, multiplies the loss by the world size before backward.

Modes (T valid tokens, S sequences with at least one valid token, L = max_response_length):
- token_mean: sum(loss) / T (DAPO).
- seq_mean_token_mean: sum_i(mean_t loss_i) / S (GRPO's original; a sequence's length is clamped to >= 1).
- seq_mean_token_sum: sum_i(sum_t loss_i) / S.
- seq_mean_token_sum_norm: sum(loss) / (S * L) (Dr. GRPO: a constant normaliser, no length bias).
  Departure from verl, which divides by the padded width R only: Dr. GRPO's reference code divides
  each sequence's sum by the generation budget and averages over sequences, which is S * L.

Policy losses are registry entries with one signature, `(PolicyLossInputs, PolicyLossConfig) ->
(token loss, metrics)`, in modules by family: `clipped_surrogates` (ppo_clip, gspo, geo_mean, sapo),
`reinforce_losses` (gpg, cispo) and `covariance_losses` (clip_cov, kl_cov). `policy_loss` looks one
up by spec.algorithm.policyLoss and aggregates it here. Departure from verl, whose gspo, geo_mean and
sapo aggregate on their own: here the spec's aggregation applies, and a rule keeps gspo and geo_mean
on seq_mean_token_mean, which is what verl hard-wires for them.

The value loss follows verl's `compute_value_loss`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kuberl.runtime.algorithms.devices import check_same_device
from kuberl.runtime.algorithms.masked import masked_mean
from kuberl.runtime.algorithms.registry import LOSS_AGGREGATIONS, POLICY_LOSSES

#: Log-ratios are clamped before exp so one wild token cannot overflow the ratio (as verl does).
LOG_RATIO_BOUND = 20.0


@dataclass(frozen=True)
class LossNormalizers:
    """The denominators of an aggregation: local counts, or the whole mini-batch's when given."""

    tokens: Tensor | float  # T: valid tokens
    seqs: Tensor | float  # S: sequences with at least one valid token
    max_response_length: int | None  # L: the generation budget (seq_mean_token_sum_norm only)


AggregationFn = Callable[[Tensor, Tensor, LossNormalizers], Tensor]  # (loss (N, R) 0 on padding, valid (N, R)) -> ()


def count_tokens_and_sequences(mask: Tensor) -> tuple[int, int]:
    """(T, S) of a batch as `aggregate_loss` counts them; pass the whole mini-batch's as global counts."""
    valid = mask.bool()  # (N, R)
    return int(valid.sum()), int(valid.any(-1).sum())


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(loss: Tensor, valid: Tensor, norm: LossNormalizers) -> Tensor:
    return loss.sum() / norm.tokens  # ()


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(loss: Tensor, valid: Tensor, norm: LossNormalizers) -> Tensor:
    lengths = valid.sum(-1).clamp(min=1)  # (N,)
    return (loss.sum(-1) / lengths).sum() / norm.seqs  # ()


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(loss: Tensor, valid: Tensor, norm: LossNormalizers) -> Tensor:
    return loss.sum() / norm.seqs  # ()


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(loss: Tensor, valid: Tensor, norm: LossNormalizers) -> Tensor:
    if norm.max_response_length is None or norm.max_response_length < 1:
        raise ValueError(
            "loss aggregation seq_mean_token_sum_norm needs max_response_length (the rollout's max new tokens, "
            f"spec.rollout.sampling); got {norm.max_response_length!r}"
        )
    return loss.sum() / (norm.seqs * norm.max_response_length)  # ()


def aggregate_loss(
    token_loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_response_length: int | None = None,
) -> Tensor:
    """One scalar from per-token losses (N, R); padding, whatever it holds, contributes nothing.

    The whole mini-batch's counts come as numbers (the update counts them on the host before its passes), so
    dividing by them moves nothing between the host and the device.
    """
    check_same_device("aggregate_loss", token_loss=token_loss, mask=mask)
    valid = mask.bool()  # (N, R)
    loss = torch.where(valid, token_loss, 0.0)  # (N, R)
    norm = LossNormalizers(
        tokens=valid.sum().clamp(min=1) if global_tokens is None else max(float(global_tokens), 1.0),
        seqs=valid.any(-1).sum().clamp(min=1) if global_seqs is None else max(float(global_seqs), 1.0),
        max_response_length=max_response_length,
    )
    return LOSS_AGGREGATIONS.get(mode)(loss, valid, norm)  # ()


@dataclass(frozen=True)
class PolicyLossInputs:
    """What every policy loss may read: n responses of one micro-batch, R response tokens (right padded)."""

    logprobs: Tensor  # (n, R) log pi_theta of the sampled tokens; carries the gradient
    old_logprobs: Tensor  # (n, R) log pi_old, the behaviour policy (detached)
    advantages: Tensor  # (n, R)
    mask: Tensor  # (n, R) 1 on tokens that train, 0 on padding (and on tokens left out)
    is_weights: Tensor | None = None  # (n, R) rollout-correction importance weights (detached); None: all 1
    seed: int = 0  # seeds the draw of losses that pick tokens at random (clip_cov), so a run replays

    def __post_init__(self) -> None:
        check_same_device(
            "policy loss",
            logprobs=self.logprobs,
            old_logprobs=self.old_logprobs,
            advantages=self.advantages,
            mask=self.mask,
            is_weights=self.is_weights,
        )


@dataclass(frozen=True)
class PolicyLossConfig:
    """Every loss's knobs (spec.algorithm); a loss reads the ones it has."""

    clip_low: float = 0.2  # clipRatioLow
    clip_high: float = 0.2  # clipRatioHigh
    dual_clip_c: float | None = 3.0  # ppo_clip's dualClipC
    clip_cov_ratio: float = 0.0002  # clipCov.ratio
    clip_cov_lower: float = 1.0  # clipCov.lowerBound
    clip_cov_upper: float = 5.0  # clipCov.upperBound
    kl_cov_ratio: float = 0.0002  # klCov.ratio
    kl_cov_coef: float = 1.0  # klCov.coef
    tau_positive: float = 1.0  # sapo.tauPositive
    tau_negative: float = 1.05  # sapo.tauNegative


#: (inputs, config) -> (token loss (n, R), detached metrics). The loss is 0 on padding or is masked by
#: `policy_loss`, which aggregates it; so every loss is invariant to how the batch is sharded.
PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossConfig], tuple[Tensor, dict[str, Tensor]]]


def log_ratio(inputs: PolicyLossInputs) -> Tensor:
    """log pi_theta - log pi_old, clamped before exp so one wild token cannot overflow the ratio (as verl does)."""
    return (inputs.logprobs - inputs.old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (n, R)


def importance_weighted(token_loss: Tensor, inputs: PolicyLossInputs) -> Tensor:
    """The token loss times the rollout-correction weights, when there are any (verl: pg_losses * weights)."""
    return token_loss if inputs.is_weights is None else token_loss * inputs.is_weights  # (n, R)


def policy_loss(
    name: str,
    inputs: PolicyLossInputs,
    config: PolicyLossConfig,
    aggregation: str,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_response_length: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The named policy loss (spec.algorithm.policyLoss), aggregated; its metrics are detached token means."""
    token_loss, metrics = POLICY_LOSSES.get(name)(inputs, config)  # (n, R)
    loss = aggregate_loss(
        token_loss,
        inputs.mask,
        aggregation,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        max_response_length=max_response_length,
    )  # ()
    return loss, {metric: value.detach() for metric, value in metrics.items()}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
    aggregation: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_response_length: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """0.5 * max((v - R)^2, (clip(v, old - clip, old + clip) - R)^2); clip None gives 0.5 * (v - R)^2."""
    check_same_device("value_loss", values=values, old_values=old_values, returns=returns, mask=mask)
    unclipped = (values - returns) ** 2  # (N, R)
    if clip is None:
        token_loss = unclipped  # (N, R)
        clip_fraction = values.new_zeros(())  # ()
    else:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)  # (N, R)
        clipped = (clipped_values - returns) ** 2  # (N, R)
        token_loss = torch.maximum(unclipped, clipped)  # (N, R)
        clip_fraction = masked_mean((clipped > unclipped).float(), mask)  # ()
    loss = 0.5 * aggregate_loss(
        token_loss,
        mask,
        aggregation,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        max_response_length=max_response_length,
    )  # ()
    return loss, {"value_clip_fraction": clip_fraction.detach()}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dim, in float32: logsumexp(z) - sum(softmax(z) * z)."""
    logits = logits.float()  # (..., V)
    probs = torch.softmax(logits, dim=-1)  # (..., V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # (...)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[label] in float32, without materialising the (N, R, V) log-softmax.

    `labels` must be valid vocabulary ids everywhere (pad with the pad token id, not -100).
    """
    logits = logits.float()  # (N, R, V) a no-op when already float32
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N, R)
    return picked - torch.logsumexp(logits, dim=-1)  # (N, R)
