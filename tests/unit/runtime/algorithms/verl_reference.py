"""verl's reference formulas (trainer/ppo/core_algos.py), written out plainly for the comparison tests.

Each function restates one of verl's estimators or losses in its own shape: per-group Python loops
over dicts for the estimators, its token-mean / seq-mean-token-mean aggregation for the losses, the
whole batch at once. They are the yardstick kuberl's vectorised, sharding-invariant versions are held
to on random inputs. Written from verl's source as read with the search tool; no kuberl code is used.
"""

from collections import defaultdict

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum()


def agg(loss: Tensor, mask: Tensor, mode: str) -> Tensor:
    """verl's agg_loss for the modes the comparisons use, on one micro-batch with no global batch info (its
    legacy FSDP worker, the default); seq-mean-token-sum-norm divides by the width, never by the sequences."""
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (loss * mask).sum(-1).sum() / mask.shape[-1]
    raise ValueError(mode)


# ---------------------------------------------------------------- estimators (outcome, group-wise)


def _groups(index: list[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, group in enumerate(index):
        members[group].append(i)
    return members


def grpo(token_rewards: Tensor, mask: Tensor, index: list[int], eps: float = 1e-6, norm: bool = True) -> Tensor:
    scores = token_rewards.sum(-1).clone()
    out = scores.clone()
    for members in _groups(index).values():
        group = scores[members]
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(members) == 1 else (group.mean(), group.std())
        for i in members:
            out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out[:, None] * mask


def opo(token_rewards: Tensor, mask: Tensor, index: list[int]) -> Tensor:
    lengths = mask.sum(-1)
    scores = token_rewards.sum(-1).clone()
    out = scores.clone()
    for members in _groups(index).values():
        baseline = (
            torch.tensor(0.0)
            if len(members) == 1
            else (lengths[members] * scores[members]).sum() / lengths[members].sum()
        )
        for i in members:
            out[i] = scores[i] - baseline
    return out[:, None] * mask


def gpg(token_rewards: Tensor, mask: Tensor, index: list[int]) -> Tensor:
    scores = token_rewards.sum(-1).clone()
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    out = scores.clone()
    for members in _groups(index).values():
        mean = torch.tensor(0.0) if len(members) == 1 else scores[members].mean()
        for i in members:
            out[i] = alpha * (scores[i] - mean) / 1.0  # f_norm = 1
    return out[:, None] * mask


def grpo_passk(token_rewards: Tensor, mask: Tensor, index: list[int], eps: float = 1e-6, norm: bool = True) -> Tensor:
    scores = token_rewards.sum(-1)
    out = torch.zeros_like(scores)
    for members in _groups(index).values():
        group = scores[members]
        top, top_index = torch.topk(group, 2)
        advantage = top[0] - top[1]
        if norm:
            advantage = advantage / (group.std() + eps)
        out[members[int(top_index[0])]] = advantage
    return out[:, None] * mask


def rloo_vectorized(token_rewards: Tensor, mask: Tensor, index: list[int]) -> Tensor:
    """compute_rloo_vectorized_outcome_advantage: (c s - sum) / (c - 1) per group of c, 0 for a group of one."""
    scores = token_rewards.sum(-1)
    inverse = torch.unique(torch.tensor(index), return_inverse=True)[1]
    count = torch.bincount(inverse)[inverse].to(scores.dtype)
    total = torch.bincount(inverse, weights=scores)[inverse]
    advantage = ((count * scores - total) / (count - 1).clamp_min(1)) * (count > 1)
    return advantage[:, None] * mask


def grpo_vectorized(token_rewards: Tensor, mask: Tensor, index: list[int], eps: float = 1e-6) -> Tensor:
    """compute_grpo_vectorized_outcome_advantage with verl/utils/groupwise.py group_mean_std: the unbiased
    variance, floored at eps, then (s - mean) / (std + eps); a group of one: mean 0, std 1."""
    scores = token_rewards.sum(-1).to(torch.float32)
    inverse = torch.unique(torch.tensor(index), return_inverse=True)[1]
    count = torch.bincount(inverse).to(torch.float32)
    total = torch.bincount(inverse, weights=scores)
    squares = torch.bincount(inverse, weights=scores * scores)
    mean = torch.where(count > 1, total / count, torch.zeros_like(total))
    variance = ((squares - total * total / count) / (count - 1).clamp_min(1)).clamp_min(eps)
    std = torch.where(count > 1, variance.sqrt(), torch.ones_like(variance))
    return ((scores - mean[inverse]) / (std[inverse] + eps))[:, None] * mask


# ---------------------------------------------------------------- estimators (a baseline per token)


def _otb_inputs(
    token_rewards: Tensor, mask: Tensor, old_log_probs: Tensor, sum_pi_squared: Tensor, is_weights: Tensor | None
) -> tuple[Tensor, Tensor]:
    """compute_*optimal_token_baseline_advantage's steps 0-3: the returns-to-go and W_t, as verl writes them."""
    returns = (token_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if is_weights is not None:
        w = w * (is_weights**2)
    return returns, (w * mask).cumsum(dim=-1)


def optimal_token_baseline(
    token_rewards: Tensor,
    mask: Tensor,
    index: list[int],
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """compute_optimal_token_baseline_advantage, handle_zero_tail=True (its default)."""
    returns, w_cumulative = _otb_inputs(token_rewards, mask, old_log_probs, sum_pi_squared, is_weights)
    baselines = torch.zeros_like(returns)
    for members in _groups(index).values():
        if len(members) == 1:
            continue
        idx = torch.tensor(members)
        group_mask = mask[idx]
        numerator = (returns[idx] * w_cumulative[idx] * group_mask).sum(dim=0)
        denominator = (w_cumulative[idx] * group_mask).sum(dim=0) + eps
        baselines[idx] = (numerator / denominator).unsqueeze(0).expand(len(members), -1)
        lengths = group_mask.sum(dim=-1)
        ordered = torch.sort(lengths).values
        longest, second = int(ordered[-1].item()), int(ordered[-2].item())
        at_longest = (lengths == longest).nonzero(as_tuple=True)[0]
        if at_longest.numel() == 1 and longest > second:
            baselines[members[int(at_longest[0])], second:] = 0.0
    return (returns - baselines) * mask


def tir_optimal_token_baseline(
    token_rewards: Tensor,
    mask: Tensor,
    index: list[int],
    old_log_probs: Tensor,
    sum_pi_squared: Tensor,
    is_weights: Tensor | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """compute_multi_turn_optimal_token_baseline_advantage, handle_zero_tail=True (its default)."""
    token_returns, w_cumulative = _otb_inputs(token_rewards, mask, old_log_probs, sum_pi_squared, is_weights)
    lengths = mask.sum(dim=-1).to(torch.long)
    width = int(lengths.max().item())
    all_w = w_cumulative.new_zeros((len(lengths), width))
    all_returns = torch.zeros_like(all_w)
    for i in range(len(lengths)):
        if int(lengths[i]) == 0:
            continue
        row = mask[i].bool()
        all_w[i, : int(lengths[i])] = w_cumulative[i, row]
        all_returns[i, : int(lengths[i])] = token_returns[i, row]
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(lengths)):
        if int(lengths[i]) > 0:
            groups[index[i]].append(i)
    baselines = torch.zeros_like(all_returns)
    for members in groups.values():
        idx = torch.tensor(members)
        if len(members) == 1:
            baselines[idx[0]] = 0.0
            continue
        b_star = (all_returns[idx] * all_w[idx]).sum(dim=0) / (all_w[idx].sum(dim=0) + eps)
        baselines[idx] = b_star.to(baselines.dtype)
        group_lengths = lengths[idx]
        ordered = torch.sort(group_lengths).values
        longest, second = int(ordered[-1].item()), int(ordered[-2].item())
        at_longest = (group_lengths == longest).nonzero(as_tuple=True)[0]
        if at_longest.numel() == 1 and longest > second:
            baselines[members[int(at_longest[0])], second:] = 0.0
    all_advantages = all_returns - baselines
    advantages = torch.zeros_like(token_returns)
    for i in range(len(lengths)):
        if int(lengths[i]) > 0:
            advantages[i, mask[i].bool()] = all_advantages[i, : int(lengths[i])]
    return advantages * mask


# ---------------------------------------------------------------- policy losses


def vanilla(
    old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, low: float, high: float, c: float, mode: str
) -> Tensor:
    ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-adv * c, clip1)
    return agg(torch.where(adv < 0, clip2, clip1), mask, mode)


def gspo(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    negative_approx_kl = new - old
    seq_kl = torch.sum(negative_approx_kl * mask, dim=-1) / torch.sum(mask, dim=-1).clamp(min=1)
    log_ratio = new - new.detach() + seq_kl.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
    return agg(losses, mask, "seq-mean-token-mean")


def cispo(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, low: float, high: float, mode: str) -> Tensor:
    ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    clipped = torch.clamp(ratio, 1 - low, 1 + high).detach()
    return agg(-clipped * adv * new, mask, mode)


def gpg_loss(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, mode: str) -> Tensor:
    return agg(-new * adv, mask, mode)


def geo_mean(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    negative_approx_kl = new - old
    sign = torch.sign(adv)
    clamped = torch.clamp(negative_approx_kl, -low, high)
    kl_min = sign * torch.min(sign * negative_approx_kl, sign * clamped)
    lengths = mask.sum(-1)
    ratio = torch.exp((kl_min * mask).sum(-1) / (lengths + 1e-8))
    advantage = (adv * mask).sum(-1) / (lengths + 1e-8)
    return torch.mean(-advantage * ratio)


def sapo(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, tau_pos: float, tau_neg: float) -> Tensor:
    ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))
    taus = torch.where(adv > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return agg(-gates * adv, mask, "seq-mean-token-mean")


def kl_cov(old: Tensor, new: Tensor, adv: Tensor, mask: Tensor, ratio_k: float, coef: float, mode: str) -> Tensor:
    negative_approx_kl = new - old
    ratio = torch.exp(negative_approx_kl)
    losses = -adv * ratio
    losses_kl = -adv * ratio + coef * negative_approx_kl.abs()
    valid = mask > 0
    valid_index = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    valid_adv = adv[valid].detach().reshape(-1)
    valid_logp = new[valid].detach().reshape(-1)
    cov = (valid_adv - valid_adv.mean()) * (valid_logp - valid_logp.mean())
    top = valid_index[torch.topk(cov, max(1, int(len(cov) * ratio_k)), largest=True).indices]
    rows, cols = top // adv.shape[1], top % adv.shape[1]
    losses = losses.clone()
    losses[rows, cols] = losses_kl[rows, cols]
    return agg(losses, mask, mode)


def clip_cov(
    old: Tensor,
    new: Tensor,
    adv: Tensor,
    mask: Tensor,
    low: float,
    high: float,
    ratio_k: float,
    lower: float,
    upper: float,
    mode: str,
    generator: torch.Generator,
) -> Tensor:
    ratio = torch.exp(new - old)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clip_by_origin = (losses2 > losses1) & (mask > 0)
    cov = (adv - masked_mean(adv, mask)) * (new.detach() - masked_mean(new.detach(), mask))
    cov[mask == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(ratio_k * mask.sum().item()), 1)
    candidates = torch.nonzero((cov < upper) & (cov > lower) & (mask > 0))
    corr = torch.ones_like(adv)
    if len(candidates) > 0:
        candidates = candidates[torch.randperm(len(candidates), generator=generator)[: min(clip_num, len(candidates))]]
        corr[candidates[:, 0], candidates[:, 1]] = 0
    return agg(torch.maximum(losses1, losses2) * corr, mask, mode)
