"""The token-baseline estimators (optimal_token_baseline, tir_optimal_token_baseline) against verl's own formulas
(verl_reference.py, restated from core_algos.py at b178a3cd), by hand, and under kuberl's failed-reward rules."""

import pytest
import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.advantages import AdvantageInputs, estimator_reads
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from tests.unit.runtime.algorithms import verl_reference as verl

ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def random_batch(seed: int, holes: bool = False) -> dict:
    """Groups of 1 to 4 responses of mixed lengths (some with a unique longest); `holes`: episodes whose model
    tokens have observations between them (0s inside the mask)."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [4, 3, 1, 2, 4]
    index = [group for group, size in enumerate(sizes) for _ in range(size)]
    n, width = len(index), 9
    lengths = torch.randint(1, width + 1, (n,), generator=generator)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()  # (N, R)
    if holes:
        mask = mask * (torch.rand(n, width, generator=generator) > 0.25).float()
        mask[:, 0] = 1.0  # every episode starts with a model token
    rewards = torch.zeros(n, width)
    last = (mask * torch.arange(width)).argmax(-1)
    rewards[torch.arange(n), last] = torch.randn(n, generator=generator)
    logprobs = -torch.rand(n, width, generator=generator) * 3 * mask
    squares = (torch.rand(n, width, generator=generator) * 0.9 + 0.05) * mask
    return {"rewards": rewards, "mask": mask, "index": index, "logprobs": logprobs, "squares": squares}


def kuberl(name: str, batch: dict, is_weights=None, scored=None):
    inputs = AdvantageInputs(
        token_rewards=batch["rewards"],
        response_mask=batch["mask"],
        group_index=torch.tensor(batch["index"]),
        old_logprobs=batch["logprobs"],
        sum_pi_squared=batch["squares"],
        is_weights=is_weights,
        scored=scored,
    )
    return ADVANTAGE_ESTIMATORS.get(name)(inputs)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weighted", [False, True], ids=["no-correction", "truncated-is"])
def test_optimal_token_baseline_is_verls(seed: int, weighted: bool) -> None:
    batch = random_batch(seed)
    weights = (
        (torch.rand(batch["mask"].shape, generator=torch.Generator().manual_seed(seed)) + 0.5) if weighted else None
    )
    advantages, returns = kuberl("optimal_token_baseline", batch, weights)
    expected = verl.optimal_token_baseline(
        batch["rewards"], batch["mask"], batch["index"], batch["logprobs"], batch["squares"], weights
    )
    assert_close(advantages, expected, rtol=1e-5, atol=1e-6)
    assert_close(returns, (batch["rewards"] * batch["mask"]).flip(-1).cumsum(-1).flip(-1) * batch["mask"])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("holes", [False, True], ids=["single-turn", "episodes"])
def test_tir_optimal_token_baseline_is_verls(seed: int, holes: bool) -> None:
    batch = random_batch(seed, holes=holes)
    advantages, _ = kuberl("tir_optimal_token_baseline", batch)
    expected = verl.tir_optimal_token_baseline(
        batch["rewards"], batch["mask"], batch["index"], batch["logprobs"], batch["squares"]
    )
    assert_close(advantages, expected, rtol=1e-5, atol=1e-6)


def test_one_response_each_the_two_forms_agree() -> None:
    batch = random_batch(3)
    assert_close(kuberl("optimal_token_baseline", batch)[0], kuberl("tir_optimal_token_baseline", batch)[0])


def test_a_group_of_two_by_hand() -> None:
    """Two responses of two tokens, rewards 1 and 0 on the last token, pi = 1/2 for every sampled token and
    sum_v pi(v)^2 = 1/2: each step adds w = 1 - 2 (1/2) + 1/2 = 1/2, so W = (1/2, 1) for both. The returns are
    (1, 1) and (0, 0); B_t = (1 W_t + 0 W_t) / (2 W_t) = 1/2 at both positions; A = (1/2, 1/2) and (-1/2, -1/2)."""
    mask = torch.ones(2, 2)
    batch = {
        "rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        "mask": mask,
        "index": [0, 0],
        "logprobs": torch.log(torch.full((2, 2), 0.5)),
        "squares": torch.full((2, 2), 0.5),
    }
    for name in ESTIMATORS:
        assert_close(kuberl(name, batch)[0], torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))


def test_a_failed_reward_trains_nothing_and_is_in_no_baseline() -> None:
    batch = random_batch(1)
    scored = torch.ones(len(batch["index"]), dtype=torch.bool)
    scored[0] = False  # in the first group (4 responses): the others' baselines are the three scored ones'
    scored[7] = False  # in the group of one: nothing to learn from
    scored[8] = False  # in the group of two: its partner is left alone, and teaches nothing
    for name in ESTIMATORS:
        advantages, _ = kuberl(name, batch, scored=scored)
        assert advantages[[0, 7, 8, 9]].abs().sum() == 0
        rows = [1, 2, 3]
        without = {
            "rewards": batch["rewards"][rows],
            "mask": batch["mask"][rows],
            "index": [0, 0, 0],
            "logprobs": batch["logprobs"][rows],
            "squares": batch["squares"][rows],
        }
        assert_close(advantages[rows], kuberl(name, without)[0])


def test_they_read_the_old_policy_before_the_update() -> None:
    for name in ESTIMATORS:
        assert {"old_logprobs", "sum_pi_squared"} <= estimator_reads(ADVANTAGE_ESTIMATORS.get(name))
