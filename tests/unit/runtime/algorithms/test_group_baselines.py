"""The new estimators (opo, gpg, grpo_passk) by hand and against verl's formulas; failed samples out of every
estimator's statistics."""

import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from kuberl.api.enums import GROUP_ESTIMATORS
from kuberl.runtime.algorithms.advantages import AdvantageInputs
from kuberl.runtime.algorithms.group_baselines import gpg_advantages, grpo_passk_advantages, opo_advantages
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from tests.unit.runtime.algorithms import verl_reference as verl
from tests.unit.runtime.algorithms.test_advantages import MASK, mask_of, outcome_rewards, per_response, shared_batch

R = 4


def test_opo_baseline_is_the_length_weighted_group_mean() -> None:
    # scores 1 and 3 with lengths 3 and 1: baseline (3*1 + 1*3) / (3 + 1) = 1.5 -> 1 - 1.5, 3 - 1.5
    # (the plain mean 2 would give -1, 1: the long response weighs more)
    inputs = AdvantageInputs(
        token_rewards=outcome_rewards([1.0, 3.0], [3, 1]),
        response_mask=mask_of([3, 1]),
        group_index=torch.tensor([0, 0]),
    )
    advantages, returns = opo_advantages(inputs)
    assert_close(advantages, torch.tensor([[-0.5, -0.5, -0.5, 0.0], [1.5, 0.0, 0.0, 0.0]]))
    assert_close(returns, advantages)


def test_gpg_scales_the_centred_scores_by_the_share_of_non_zero_scores() -> None:
    # shared batch: 5 responses, 4 with a non-zero score -> alpha = 5/4
    # prompt 0 (1, 2, 3; mean 2): -1.25, 0, 1.25 ; prompt 7 (0, 4; mean 2): -2.5, 2.5 ; no std division
    advantages, _ = gpg_advantages(shared_batch())
    assert_close(advantages, per_response([-1.25, 0.0, 1.25, -2.5, 2.5]))


@pytest.mark.parametrize(
    ("normalize_std", "expected"),
    [
        # prompt 0 (1, 2, 3): best 3 beats 2 by 1, std 1 -> 1 / (1 + 1e-6) ; prompt 7 (0, 4): 4, std 2 sqrt 2 -> sqrt 2
        (True, [0.0, 0.0, 1 / (1 + 1e-6), 0.0, 4 / (2 * math.sqrt(2) + 1e-6)]),
        (False, [0.0, 0.0, 1.0, 0.0, 4.0]),
    ],
)
def test_grpo_passk_rewards_only_the_best_of_each_group(normalize_std: bool, expected: list[float]) -> None:
    advantages, _ = grpo_passk_advantages(shared_batch(normalize_std=normalize_std))
    assert_close(advantages, per_response(expected))


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [("opo", [3.0]), ("gpg", [3.0]), ("grpo_passk", [0.0])],  # baseline 0; gpg's alpha = 1/1; passk: no second
)
def test_a_group_of_one_by_design(estimator: str, expected: list[float]) -> None:
    inputs = AdvantageInputs(
        token_rewards=outcome_rewards([3.0], [2]), response_mask=mask_of([2]), group_index=torch.tensor([0])
    )
    advantages, _ = ADVANTAGE_ESTIMATORS.get(estimator)(inputs)
    assert_close(advantages, torch.tensor([expected[0], expected[0], 0.0, 0.0])[None])


# ---------------------------------------------------------------- verl's formulas on random inputs


def random_groups(seed: int) -> tuple[Tensor, Tensor, list[int]]:
    """Token rewards (outcome on the last token; a third of the scores 0), mask, group ids of 2-5 members."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 6, (4,), generator=generator).tolist()
    index = [group for group, size in enumerate(sizes) for _ in range(size)]
    n = len(index)
    lengths = torch.randint(1, 7, (n,), generator=generator)  # (n,)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()  # (n, 6)
    scores = torch.rand(n, generator=generator) * (torch.rand(n, generator=generator) > 0.33)  # (n,)
    rewards = torch.zeros(n, 6)
    rewards[torch.arange(n), lengths - 1] = scores
    return rewards, mask, index


VERL_ESTIMATORS = {
    "grpo": lambda r, m, i: verl.grpo(r, m, i),
    "opo": verl.opo,
    "gpg": verl.gpg,
    "grpo_passk": lambda r, m, i: verl.grpo_passk(r, m, i),
}


@pytest.mark.parametrize("estimator", sorted(VERL_ESTIMATORS))
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_equals_verls_formula_on_random_groups(estimator: str, seed: int) -> None:
    rewards, mask, index = random_groups(seed)
    inputs = AdvantageInputs(token_rewards=rewards, response_mask=mask, group_index=torch.tensor(index))
    advantages, _ = ADVANTAGE_ESTIMATORS.get(estimator)(inputs)
    assert_close(advantages, VERL_ESTIMATORS[estimator](rewards, mask, index))


# ---------------------------------------------------------------- failed samples


def estimator_inputs(scores: list[float], groups: list[int], scored: list[bool] | None = None) -> AdvantageInputs:
    """Outcome rewards of lengths 1..3, with values, greedy baselines and the old policy's per-token numbers, so
    every estimator can run."""
    lengths = [1 + i % 3 for i in range(len(scores))]
    return AdvantageInputs(
        token_rewards=outcome_rewards(scores, lengths),
        response_mask=mask_of(lengths),
        group_index=torch.tensor(groups),
        values=torch.linspace(0.1, 0.9, len(scores) * R).view(len(scores), R),
        baseline_scores=torch.full((len(scores),), 0.25),
        old_logprobs=-torch.linspace(0.2, 2.0, len(scores) * R).view(len(scores), R),
        sum_pi_squared=torch.linspace(0.1, 0.8, len(scores) * R).view(len(scores), R),
        scored=None if scored is None else torch.tensor(scored),
        gamma=0.9,
        lam=0.95,
    )


def without_row(inputs: AdvantageInputs, row: int) -> AdvantageInputs:
    keep = [i for i in range(len(inputs.group_index)) if i != row]
    return AdvantageInputs(
        token_rewards=inputs.token_rewards[keep],
        response_mask=inputs.response_mask[keep],
        group_index=inputs.group_index[keep],
        values=None if inputs.values is None else inputs.values[keep],
        baseline_scores=None if inputs.baseline_scores is None else inputs.baseline_scores[keep],
        old_logprobs=None if inputs.old_logprobs is None else inputs.old_logprobs[keep],
        sum_pi_squared=None if inputs.sum_pi_squared is None else inputs.sum_pi_squared[keep],
        gamma=inputs.gamma,
        lam=inputs.lam,
    )


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS.names())
def test_one_of_four_failing_leaves_the_other_three_the_advantages_of_a_group_of_three(estimator: str) -> None:
    # group 0 has four members; member 1's reward failed and carries the placeholder score 0.
    # Group 5 (two members) keeps batch statistics (whitening) non-trivial.
    scores = [0.9, 0.0, 0.2, 0.6, 0.3, 0.8]
    groups = [0, 0, 0, 0, 5, 5]
    estimate = ADVANTAGE_ESTIMATORS.get(estimator)
    with_failure = estimator_inputs(scores, groups, scored=[True, False, True, True, True, True])
    advantages, returns = estimate(with_failure)
    expected_advantages, expected_returns = estimate(without_row(with_failure, 1))
    others = [0, 2, 3, 4, 5]
    assert_close(advantages[others], expected_advantages)
    assert_close(returns[others], expected_returns)
    assert (advantages[1] == 0).all() and (returns[1] == 0).all()


@pytest.mark.parametrize("estimator", sorted(GROUP_ESTIMATORS))
def test_a_group_left_with_one_scored_member_teaches_nothing(estimator: str) -> None:
    # group 0: three members, two failed -> the survivor has no one to be compared with: advantage 0
    inputs = estimator_inputs([0.9, 0.1, 0.4, 0.2, 0.7], [0, 0, 0, 1, 1], scored=[True, False, False, True, True])
    advantages, _ = ADVANTAGE_ESTIMATORS.get(estimator)(inputs)
    assert (advantages[:3] == 0).all()
    assert advantages[3:].abs().sum() > 0  # the healthy group still learns


def test_a_failed_sample_no_longer_drags_its_group_mean() -> None:
    # grpo without std: group (0.9, failed, 0.3). Counting the placeholder 0 the mean would be 0.4 and the
    # advantages 0.5, -0.1; without it the mean is 0.6 and they are 0.3, -0.3.
    inputs = estimator_inputs([0.9, 0.0, 0.3], [0, 0, 0], scored=[True, False, True])
    inputs = AdvantageInputs(**{**inputs.__dict__, "normalize_std": False})
    advantages, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inputs)
    assert_close(advantages[[0, 2], 0], torch.tensor([0.3, -0.3]))


def test_scored_must_match_the_batch() -> None:
    with pytest.raises(ValueError, match=r"AdvantageInputs.scored has shape \(2,\), expected \(5,\)"):
        AdvantageInputs(
            token_rewards=outcome_rewards([1.0] * 5, [1] * 5),
            response_mask=MASK,
            group_index=torch.zeros(5).long(),
            scored=torch.ones(2).bool(),
        )
