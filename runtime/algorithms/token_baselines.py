"""Estimators with a baseline per token: verl's optimal token baseline (OTB) and its multi-turn form.

For each group of responses to one prompt and each position t, the baseline is the return-to-go of the group's
responses weighted by their cumulative path variance:

    B_t = sum_i G_i,t W_i,t / sum_i W_i,t        W_i,t = sum_{j<=t} (1 - 2 pi_i,j + sum_v pi_i,j(v)^2)

and the advantage is G_t - B_t. `pi_j` is the probability the old policy gave the sampled token j and
`sum_v pi_j(v)^2` its whole distribution's sum of squares, which the trainer's old-log-prob pass returns when an
estimator reads `sum_pi_squared` (FSDPTrainer: exp(logsumexp(2z) - 2 logsumexp(z)) of the logits it computes
anyway). With truncated importance sampling (algorithm.rolloutCorrection) each step's weight is multiplied by the
squared weight w_t^2, as verl does. Both read the old log-probs before the update, so the on-policy shortcut
(one forward for pi_old and the update) is off: these estimators cost the old-log-prob pass.

- optimal_token_baseline: the baseline at each position of the response layout (verl's
  compute_optimal_token_baseline_advantage);
- tir_optimal_token_baseline: the baseline at each of the model's tokens counted in order, so that in an
  episode the k-th token the model wrote is compared with the others' k-th, whatever observations came between
  (verl's compute_multi_turn_optimal_token_baseline_advantage). One response each, the two are the same.

As verl (trainer/ppo/core_algos.py at b178a3cd), with its default handle_zero_tail: a group's one longest
response gets baseline 0 past the second-longest's length, where no other response tells anything. Departures
(kuberl's estimators' conventions, advantages.py): a sample whose reward failed has advantage 0 and is in no
group's sums, and a group left with one scored member teaches nothing (0), where verl would give it its return.
"""

import torch
from torch import Tensor

from kuberl.runtime.algorithms.advantages import AdvantageInputs, reads, scored_rows, trained_tokens
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS

#: Added to a baseline's denominator, as verl does.
OTB_EPSILON = 1e-8


def returns_to_go(inputs: AdvantageInputs) -> Tensor:
    """(N, R) each token's undiscounted reward-to-go over the response's valid tokens."""
    rewards = torch.where(inputs.response_mask.bool(), inputs.token_rewards.float(), 0.0)  # (N, R)
    return rewards.flip(-1).cumsum(-1).flip(-1)  # (N, R)


def path_variance(inputs: AdvantageInputs) -> Tensor:
    """(N, R) W_t: the cumulative sum over the valid tokens up to t of 1 - 2 pi_t + sum_v pi_t(v)^2."""
    assert inputs.old_logprobs is not None and inputs.sum_pi_squared is not None
    step = 1 - 2 * torch.exp(inputs.old_logprobs.float()) + inputs.sum_pi_squared.float()  # (N, R)
    if inputs.is_weights is not None:  # truncated importance sampling: W scaled by the squared weight
        step = step * inputs.is_weights.float() ** 2  # (N, R)
    return torch.where(inputs.response_mask.bool(), step, 0.0).cumsum(-1)  # (N, R)


def group_baselines(returns: Tensor, variance: Tensor, valid: Tensor, lengths: Tensor, members: list[Tensor]) -> Tensor:
    """(N, L) each row's baseline per position from the `valid` positions of the rows of its group (`members`:
    each group's scored rows); a group's lone longest row (`lengths`) gets 0 past the second-longest's length
    (verl's handle_zero_tail)."""
    baselines = torch.zeros_like(returns)  # (N, L)
    for rows in members:
        if len(rows) < 2:
            continue  # alone by design: no baseline (a group left alone by failed rewards is zeroed later)
        weights = torch.where(valid[rows], variance[rows], 0.0)  # (n, L)
        baseline = (returns[rows] * weights).sum(0) / (weights.sum(0) + OTB_EPSILON)  # (L,)
        baselines[rows] = baseline.expand(len(rows), -1)
        second, longest = torch.sort(lengths[rows]).values[-2:].tolist()
        if longest > second and int((lengths[rows] == longest).sum()) == 1:
            baselines[rows[lengths[rows] == longest], int(second) :] = 0.0
    return baselines


def groups_of(inputs: AdvantageInputs) -> list[Tensor]:
    """The scored rows of each group, as index tensors."""
    scored = scored_rows(inputs)  # (N,)
    return [
        torch.nonzero((inputs.group_index == group) & scored).flatten() for group in torch.unique(inputs.group_index)
    ]


def learning_rows(inputs: AdvantageInputs, members: list[Tensor]) -> Tensor:
    """(N,) bool: scored rows compared with another scored member, or alone in their group by design."""
    learns = torch.zeros_like(inputs.group_index, dtype=torch.bool)  # (N,)
    for rows in members:
        whole = int((inputs.group_index == inputs.group_index[rows[0]]).sum()) if len(rows) else 0
        if len(rows) >= 2 or (len(rows) == 1 and whole == 1):
            learns[rows] = True
    return learns


@ADVANTAGE_ESTIMATORS.register("optimal_token_baseline")
@reads("old_logprobs", "sum_pi_squared", "is_weights")
@torch.no_grad()
def optimal_token_baseline(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """A_t = G_t - B_t with B_t the path-variance-weighted mean return at position t of the group (module)."""
    returns = returns_to_go(inputs)  # (N, R)
    members = groups_of(inputs)
    mask = inputs.response_mask.bool()  # (N, R)
    baselines = group_baselines(returns, path_variance(inputs), mask, mask.sum(-1), members)  # (N, R)
    keep = trained_tokens(inputs) & learning_rows(inputs, members)[:, None]  # (N, R)
    advantages = torch.where(keep, returns - baselines, 0.0)  # (N, R)
    return advantages, torch.where(inputs.response_mask.bool(), returns, 0.0)


@ADVANTAGE_ESTIMATORS.register("tir_optimal_token_baseline")
@reads("old_logprobs", "sum_pi_squared", "is_weights")
@torch.no_grad()
def tir_optimal_token_baseline(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """OTB over the model's tokens in the order it wrote them: the k-th against the group's k-th (module)."""
    mask = inputs.response_mask.bool()  # (N, R) the model's tokens (an episode's observations are not)
    returns, variance = returns_to_go(inputs), path_variance(inputs)  # (N, R)
    lengths = mask.sum(-1)  # (N,)
    width = int(lengths.max()) if len(lengths) else 0
    # each row's model tokens moved to the left, in order: position k is the row's k-th token
    order = torch.sort(torch.where(mask, torch.arange(mask.shape[1]), mask.shape[1]), dim=-1, stable=True)
    packed_returns = returns.gather(-1, order.indices)[:, :width]  # (N, K)
    packed_variance = variance.gather(-1, order.indices)[:, :width]  # (N, K)
    members = groups_of(inputs)
    inside = torch.arange(width)[None] < lengths[:, None]  # (N, K) row i's first lengths[i] positions
    packed = group_baselines(packed_returns, packed_variance, inside, lengths, members)  # (N, K)
    baselines = torch.zeros_like(returns)  # (N, R)
    baselines.scatter_(-1, order.indices[:, :width], packed)  # back to where each token sits
    keep = trained_tokens(inputs) & learning_rows(inputs, members)[:, None]  # (N, R)
    return torch.where(keep, returns - baselines, 0.0), torch.where(mask, returns, 0.0)
