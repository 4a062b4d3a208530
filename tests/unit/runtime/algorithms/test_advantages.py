"""Advantage estimators against values derived by hand; padding is always exactly 0 and never NaN."""

import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from kuberl.runtime.algorithms.advantages import BASE_READS, AdvantageInputs, estimator_reads
from kuberl.runtime.algorithms.group_baselines import (
    grpo_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
)
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from kuberl.runtime.algorithms.returns import gae_advantages, reinforce_plus_plus_advantages, remax_advantages

R = 4


def mask_of(lengths: list[int], width: int = R) -> Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()  # (N, width)


def outcome_rewards(scores: list[float], lengths: list[int], width: int = R) -> Tensor:
    """Each score on its response's last token, zeros elsewhere."""
    rewards = torch.zeros(len(scores), width)  # (N, width)
    rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores)
    return rewards


# The shared batch: two prompts. Prompt 0 has three responses scoring 1, 2, 3; prompt 7 (ids need
# not be contiguous) has two scoring 0 and 4. Lengths 2, 4, 2, 1, 1 out of R = 4.
SCORES = [1.0, 2.0, 3.0, 0.0, 4.0]
LENGTHS = [2, 4, 2, 1, 1]
GROUPS = torch.tensor([0, 0, 0, 7, 7])  # (N,)
MASK = mask_of(LENGTHS)  # (5, 4)


def shared_batch(**options) -> AdvantageInputs:
    return AdvantageInputs(
        token_rewards=outcome_rewards(SCORES, LENGTHS), response_mask=MASK, group_index=GROUPS, **options
    )


def per_response(values: list[float]) -> Tensor:
    """Expected advantages when each response's value covers its valid tokens."""
    return torch.tensor(values)[:, None] * MASK  # (N, R)


def test_grpo_divides_each_groups_centred_score_by_its_std() -> None:
    # prompt 0: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1       -> -1, 0, 1
    # prompt 7: mean 2, unbiased std sqrt((4 + 4) / 1) = 2*sqrt(2)   -> -2/(2 sqrt 2), 2/(2 sqrt 2) = -+0.7071
    advantages, returns = grpo_advantages(shared_batch())
    expected = per_response([-1.0, 0.0, 1.0, -1 / math.sqrt(2), 1 / math.sqrt(2)])  # (5, 4)
    assert_close(advantages, expected)
    assert_close(returns, advantages)


def test_grpo_without_std_only_centres_the_scores() -> None:
    # Dr. GRPO: prompt 0: 1-2, 2-2, 3-2 ; prompt 7: 0-2, 4-2
    advantages, _ = grpo_advantages(shared_batch(normalize_std=False))
    assert_close(advantages, per_response([-1.0, 0.0, 1.0, -2.0, 2.0]))


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_group_of_one_keeps_its_raw_score(normalize_std: bool) -> None:
    # Prompt 0 has one response (score 3): mean 0, std 1 (verl's convention) -> 3 / (1 + 1e-6) ~ 3.
    inputs = AdvantageInputs(
        token_rewards=outcome_rewards([3.0, 1.0, 2.0], [2, 2, 2]),
        response_mask=mask_of([2, 2, 2]),
        group_index=torch.tensor([0, 1, 1]),
        normalize_std=normalize_std,
    )
    advantages, _ = grpo_advantages(inputs)
    assert_close(advantages[0], torch.tensor([3.0, 3.0, 0.0, 0.0]))


def test_grpo_group_with_equal_scores_gets_zero_advantage_not_nan() -> None:
    # std = 0: (1 - 1) / (0 + eps) = 0
    inputs = AdvantageInputs(
        token_rewards=outcome_rewards([1.0, 1.0], [3, 1]),
        response_mask=mask_of([3, 1]),
        group_index=torch.tensor([0, 0]),
    )
    advantages, _ = grpo_advantages(inputs)
    assert_close(advantages, torch.zeros(2, R))


def test_rloo_subtracts_the_mean_of_the_other_group_members() -> None:
    # prompt 0: 1 - (2+3)/2 = -1.5 ; 2 - (1+3)/2 = 0 ; 3 - (1+2)/2 = 1.5
    # prompt 7: 0 - 4 = -4 ; 4 - 0 = 4
    advantages, returns = rloo_advantages(shared_batch())
    assert_close(advantages, per_response([-1.5, 0.0, 1.5, -4.0, 4.0]))
    assert_close(returns, advantages)


def test_rloo_group_of_one_keeps_its_raw_score() -> None:
    inputs = AdvantageInputs(
        token_rewards=outcome_rewards([3.0, 1.0, 2.0], [2, 2, 2]),
        response_mask=mask_of([2, 2, 2]),
        group_index=torch.tensor([0, 1, 1]),
    )
    advantages, _ = rloo_advantages(inputs)
    # lone response: 3 ; pair: 1 - 2 = -1, 2 - 1 = 1
    assert_close(advantages, torch.tensor([[3.0, 3.0, 0, 0], [-1.0, -1.0, 0, 0], [1.0, 1.0, 0, 0]]))


def reinforce_batch() -> AdvantageInputs:
    # Row 0 (3 tokens): per-token rewards 1, 0, 2 (e.g. KL penalties plus a final score).
    # Row 1 (2 tokens): rewards 0, 1, then padding.
    return AdvantageInputs(
        token_rewards=torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]]),  # (2, 3)
        response_mask=mask_of([3, 2], width=3),  # (2, 3)
        group_index=torch.tensor([0, 1]),  # (2,)
        gamma=0.5,
    )


def test_reinforce_plus_plus_returns_are_discounted_within_each_response() -> None:
    # row 0: G2 = 2 ; G1 = 0 + 0.5*2 = 1 ; G0 = 1 + 0.5*1 = 1.5
    # row 1: G1 = 1 ; G0 = 0 + 0.5*1 = 0.5 ; padding 0
    _, returns = reinforce_plus_plus_advantages(reinforce_batch())
    assert_close(returns, torch.tensor([[1.5, 1.0, 2.0], [0.5, 1.0, 0.0]]))


def test_reinforce_plus_plus_advantages_are_returns_whitened_over_valid_tokens() -> None:
    # valid returns 1.5, 1, 2, 0.5, 1: mean 6/5 = 1.2; deviations 0.3, -0.2, 0.8, -0.7, -0.2
    # squares sum to 0.09 + 0.04 + 0.64 + 0.49 + 0.04 = 1.30; unbiased variance 1.30 / 4 = 0.325
    advantages, _ = reinforce_plus_plus_advantages(reinforce_batch())
    expected = torch.tensor([[0.3, -0.2, 0.8], [-0.7, -0.2, 0.0]]) / math.sqrt(0.325)  # (2, 3)
    assert_close(advantages, expected)


def test_reinforce_plus_plus_baseline_whitens_group_centred_scores() -> None:
    # centred: prompt 0: -1, 0, 1 ; prompt 7: -2, 2. Over lengths 2, 4, 2, 1, 1 the 10 valid tokens hold
    # -1,-1, 0,0,0,0, 1,1, -2, 2: mean 0; squares sum 1+1+1+1+4+4 = 12; unbiased variance 12/9 = 4/3.
    # advantage = centred / sqrt(4/3) = centred * sqrt(3)/2
    advantages, returns = reinforce_plus_plus_baseline_advantages(shared_batch())
    assert_close(advantages, per_response([-1.0, 0.0, 1.0, -2.0, 2.0]) * math.sqrt(3) / 2)
    assert_close(returns, advantages)


def remax_batch(baseline_scores: Tensor | None) -> AdvantageInputs:
    return AdvantageInputs(
        token_rewards=torch.tensor([[-0.1, 0.0, 1.0], [0.0, 0.2, 0.0]]),  # (2, 3) KL penalty -0.1, scores 1 and 0.2
        response_mask=mask_of([3, 2], width=3),  # (2, 3)
        group_index=torch.tensor([0, 1]),  # (2,)
        baseline_scores=baseline_scores,  # (2,)
    )


def test_remax_subtracts_the_greedy_score_from_the_reward_to_go() -> None:
    # row 0: reward-to-go -0.1+0+1 = 0.9, 1.0, 1.0 ; minus greedy 0.5 -> 0.4, 0.5, 0.5
    # row 1: 0.2, 0.2, padding ; minus greedy 1.0 -> -0.8, -0.8, 0
    advantages, returns = remax_advantages(remax_batch(torch.tensor([0.5, 1.0])))
    assert_close(returns, torch.tensor([[0.9, 1.0, 1.0], [0.2, 0.2, 0.0]]))
    assert_close(advantages, torch.tensor([[0.4, 0.5, 0.5], [-0.8, -0.8, 0.0]]))


def test_remax_without_baseline_scores_says_it_needs_the_greedy_baseline() -> None:
    with pytest.raises(ValueError, match="remax .* needs the greedy baseline"):
        remax_advantages(remax_batch(None))


def gae_batch() -> AdvantageInputs:
    return AdvantageInputs(
        token_rewards=torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]),  # (2, 3)
        response_mask=mask_of([3, 2], width=3),  # (2, 3)
        group_index=torch.tensor([0, 1]),  # (2,)
        values=torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]]),  # (2, 3) 9.0 sits in padding
        gamma=0.9,
        lam=0.8,
    )


# gamma = 0.9, gamma*lam = 0.72. Row 0:
#   t2: delta = 1 + 0.9*0 - 0.7 = 0.3                A2 = 0.3
#   t1: delta = 0 + 0.9*0.7 - 0.6 = 0.03             A1 = 0.03 + 0.72*0.3 = 0.246
#   t0: delta = 0 + 0.9*0.6 - 0.5 = 0.04             A0 = 0.04 + 0.72*0.246 = 0.21712
# Row 1 (t2 is padding, skipped; its value 9.0 must not be bootstrapped from):
#   t1: delta = 0.5 + 0 - 0.4 = 0.1                  A1 = 0.1
#   t0: delta = 0 + 0.9*0.4 - 0.2 = 0.16             A0 = 0.16 + 0.72*0.1 = 0.232
GAE_RAW = [0.21712, 0.246, 0.3, 0.232, 0.1]


def test_gae_returns_are_unrolled_advantages_plus_values() -> None:
    # returns = A + V: 0.71712, 0.846, 1.0 ; 0.432, 0.5, padding 0
    _, returns = gae_advantages(gae_batch())
    assert_close(returns, torch.tensor([[0.71712, 0.846, 1.0], [0.432, 0.5, 0.0]]))


def test_gae_advantages_are_the_unrolled_ones_whitened_over_valid_tokens() -> None:
    advantages, _ = gae_advantages(gae_batch())
    raw = torch.tensor(GAE_RAW)  # (5,) the valid tokens in row-major order
    whitened = (raw - raw.mean()) / raw.std()  # (5,) torch.std is unbiased
    assert_close(advantages[gae_batch().response_mask.bool()], whitened)
    assert (advantages[1, 2] == 0).item()


def test_gae_without_values_says_it_needs_a_critic() -> None:
    inputs = shared_batch()
    with pytest.raises(ValueError, match="gae .* needs a critic"):
        gae_advantages(inputs)


def with_padding(inputs: AdvantageInputs, fill: float) -> AdvantageInputs:
    padding = ~inputs.response_mask.bool()  # (N, R)
    return AdvantageInputs(
        token_rewards=inputs.token_rewards.masked_fill(padding, fill),  # (N, R)
        response_mask=inputs.response_mask,
        group_index=inputs.group_index,
        values=torch.full_like(inputs.token_rewards, 0.3).masked_fill(padding, fill),  # (N, R)
        baseline_scores=torch.linspace(0.0, 1.0, len(inputs.group_index)),  # (N,)
        old_logprobs=torch.full_like(inputs.token_rewards, -0.7).masked_fill(padding, fill),  # (N, R)
        sum_pi_squared=torch.full_like(inputs.token_rewards, 0.4).masked_fill(padding, fill),  # (N, R)
        gamma=0.9,
        lam=0.95,
    )


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS.names())
def test_padding_content_never_reaches_the_results_and_comes_back_zero(estimator: str) -> None:
    estimate = ADVANTAGE_ESTIMATORS.get(estimator)
    clean = estimate(with_padding(shared_batch(), 0.0))
    dirty = estimate(with_padding(shared_batch(), float("nan")))
    padding = ~MASK.bool()  # (5, 4)
    for clean_out, dirty_out in zip(clean, dirty, strict=True):
        assert not dirty_out.isnan().any()
        assert (dirty_out[padding] == 0).all()
        assert_close(dirty_out, clean_out)


def test_inputs_with_mismatched_shapes_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"AdvantageInputs.values has shape \(5, 3\), expected \(5, 4\)"):
        shared_batch(values=torch.zeros(5, 3))


def test_estimators_declare_the_optional_inputs_they_read() -> None:
    # The controller runs a critic only for `values`, a greedy rollout only for `baseline_scores`, and asks the
    # old-log-prob pass for sum_pi_squared only for the token baselines.
    names = ADVANTAGE_ESTIMATORS.names()
    optional = {name: estimator_reads(ADVANTAGE_ESTIMATORS.get(name)) - BASE_READS for name in names}
    assert optional == {
        "gae": {"values"},
        "gpg": set(),
        "grpo": set(),
        "grpo_passk": set(),
        "opo": set(),
        "reinforce_plus_plus": set(),
        "reinforce_plus_plus_baseline": set(),
        "remax": {"baseline_scores"},
        "rloo": set(),
        # the old-log-prob pass, with each token's sum_v pi(v)^2; the rollout correction's weights where there are
        "optimal_token_baseline": {"old_logprobs", "sum_pi_squared", "is_weights"},
        "tir_optimal_token_baseline": {"old_logprobs", "sum_pi_squared", "is_weights"},
    }


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS.names())
def test_estimators_run_on_only_the_inputs_they_declare(estimator: str) -> None:
    estimate = ADVANTAGE_ESTIMATORS.get(estimator)
    declared = estimator_reads(estimate)
    inputs = shared_batch(
        values=torch.zeros(5, R) if "values" in declared else None,
        baseline_scores=torch.zeros(5) if "baseline_scores" in declared else None,
        old_logprobs=torch.full((5, R), -0.7) if "old_logprobs" in declared else None,
        sum_pi_squared=torch.full((5, R), 0.4) if "sum_pi_squared" in declared else None,
    )
    advantages, returns = estimate(inputs)
    assert advantages.shape == returns.shape == (5, R)
