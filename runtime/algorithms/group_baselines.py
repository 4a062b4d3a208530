"""Outcome estimators that compare each response with the other responses to its prompt (its group).

Each turns a response's score s_i (the sum of its token rewards) into one advantage for all its
tokens, and returns it as both advantages and returns, as verl does. Only scored members count in a
group's statistics and a group left with one scored member teaches nothing (see `advantages`).

- grpo: DeepSeekMath (arXiv 2402.03300): (s_i - mean) / (std + eps), the std unbiased; without
  `normalize_std`, s_i - mean (Dr. GRPO, arXiv 2503.20783). As verl.
- rloo: REINFORCE leave-one-out (Ahmadian et al., arXiv 2402.14740): s_i minus the mean of the
  others, which is verl's n/(n-1) * (s_i - mean). As verl.
- opo: On-Policy RL with Optimal reward baseline (Hao et al., arXiv 2505.23585): the baseline is
  the length-weighted mean sum_j |y_j| s_j / sum_j |y_j|, optimal for sequence-summed gradients.
  As verl.
- gpg: GPG (Chu et al., arXiv 2504.02546): alpha * (s_i - mean) with no std, alpha = B / M, where
  B counts the batch's responses and M those with a non-zero score, which undoes the dilution of the
  batch mean by groups that teach nothing. As verl (its f_norm is 1). Departure: B and M count
  scored responses only.
- grpo_passk: Pass@k training (Chen et al., arXiv 2503.19595, as verl implements it): only the best
  response of each group learns, with s_max - s_second (divided by the group's std + eps when
  `normalize_std`); the others get 0. Departure: verl raises on a group of fewer than two; here such a
  group teaches nothing (its member gets 0), like every group estimator here. Of tied best responses
  the first in batch order gets the (zero) advantage.
- reinforce_plus_plus_baseline: REINFORCE++ with a group-mean baseline (arXiv 2501.03262), then
  whitened over the batch's trained tokens. As verl.
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.advantages import (
    AdvantageInputs,
    broadcast_to_tokens,
    group_stats,
    reads,
    scored_rows,
    sequence_scores,
    trained_tokens,
)
from kuberl.runtime.algorithms.masked import masked_whiten
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS


def _outcome(per_response: Tensor, learns: Tensor, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """One value per response on its trained tokens, 0 for a response that does not learn."""
    advantages = broadcast_to_tokens(torch.where(learns, per_response, 0.0), trained_tokens(inputs))  # (N, R)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("grpo")
@reads()
@torch.no_grad()
def grpo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index, scored_rows(inputs))
    centred = scores - stats.mean  # (N,)
    per_response = centred / (stats.std + inputs.eps) if inputs.normalize_std else centred  # (N,)
    return _outcome(per_response, stats.learns, inputs)


@ADVANTAGE_ESTIMATORS.register("rloo")
@reads()
@torch.no_grad()
def rloo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """s_i minus the mean of the other members of its group; a group of one keeps s_i (verl's choice)."""
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index, scored_rows(inputs))
    others_mean = (stats.total - scores) / (stats.size - 1).clamp(min=1)  # (N,)
    per_response = torch.where(stats.size > 1, scores - others_mean, scores)  # (N,)
    return _outcome(per_response, stats.learns, inputs)


@ADVANTAGE_ESTIMATORS.register("opo")
@reads()
@torch.no_grad()
def opo_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """s_i minus the length-weighted mean score of its group."""
    scores = sequence_scores(inputs)  # (N,)
    scored = scored_rows(inputs)  # (N,)
    lengths = inputs.response_mask.bool().sum(-1).to(scores.dtype)  # (N,)
    weighted = group_stats(lengths * scores, inputs.group_index, scored)  # sum_j |y_j| s_j per group
    lengths_total = group_stats(lengths, inputs.group_index, scored)  # sum_j |y_j| per group
    baseline = weighted.total / lengths_total.total.clamp(min=1)  # (N,)
    per_response = torch.where(weighted.size > 1, scores - baseline, scores)  # (N,) a group of one: baseline 0
    return _outcome(per_response, weighted.learns, inputs)


@ADVANTAGE_ESTIMATORS.register("gpg")
@reads()
@torch.no_grad()
def gpg_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """alpha * (s_i - group mean), alpha = scored responses / scored responses with a non-zero score."""
    scores = sequence_scores(inputs)  # (N,)
    scored = scored_rows(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index, scored)
    alpha = scored.sum() / (scored & (scores != 0)).sum().clamp(min=1)  # ()
    return _outcome(alpha * (scores - stats.mean), stats.learns, inputs)


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
@reads()
@torch.no_grad()
def grpo_passk_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """The best response of each group gets s_max - s_second (over std + eps with normalize_std); others 0."""
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index, scored_rows(inputs))
    per_response = torch.zeros_like(scores)  # (N,)
    for group in torch.unique(inputs.group_index):
        members = torch.nonzero((inputs.group_index == group) & stats.learns).flatten()  # (k,)
        if members.numel() < 2:
            continue  # a group of one has no second best to beat
        ranked, order = torch.sort(scores[members], descending=True, stable=True)  # (k,) a tie keeps batch order
        best = members[order[0]]
        margin = ranked[0] - ranked[1]  # ()
        per_response[best] = margin / (stats.std[best] + inputs.eps) if inputs.normalize_std else margin
    return _outcome(per_response, stats.learns, inputs)


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@reads()
@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    scores = sequence_scores(inputs)  # (N,)
    stats = group_stats(scores, inputs.group_index, scored_rows(inputs))
    trained = trained_tokens(inputs) & stats.learns[:, None]  # (N, R)
    centred = broadcast_to_tokens(scores - stats.mean, trained)  # (N, R)
    advantages = masked_whiten(centred, trained)  # (N, R)
    return advantages, advantages
