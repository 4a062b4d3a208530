"""Rollout correction: truncated and masked importance weights of the trainer against the engine, by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.correction import CorrectionConfig, rollout_correction

LN = math.log


def config(importance_sampling=None, rejection=None, threshold=2.0, low=0.5, high=2.0) -> CorrectionConfig:
    return CorrectionConfig(importance_sampling, threshold, rejection, low, high)


def test_token_weights_are_truncated_at_the_threshold() -> None:
    # w = pi_trainer / pi_engine = 1, 3, 0.5 ; truncated at 2 -> 1, 2, 0.5 ; 1 of 3 tokens truncated
    trainer = torch.tensor([[LN(1.0), LN(3.0), LN(0.5)]])
    result = rollout_correction(trainer, torch.zeros(1, 3), torch.ones(1, 3), config("token"))
    assert result.weights is not None
    assert_close(result.weights, torch.tensor([[1.0, 2.0, 0.5]]))
    assert_close(result.metrics["is_truncated_fraction"], torch.tensor(1 / 3))
    assert_close(result.metrics["is_weight_mean"], torch.tensor(3.5 / 3))
    assert result.keep.all()  # no rejection asked for


def test_sequence_weight_is_the_product_over_the_response() -> None:
    # row 0: 2 * 1.5 = 3 -> truncated to 2 on both tokens ; row 1: 0.5 * 1 (one token, then padding) = 0.5
    trainer = torch.tensor([[LN(2.0), LN(1.5)], [LN(0.5), 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    result = rollout_correction(trainer, torch.zeros(2, 2), mask, config("sequence"))
    assert result.weights is not None
    assert_close(result.weights, torch.tensor([[2.0, 2.0], [0.5, 0.0]]))
    assert_close(result.metrics["is_truncated_response_fraction"], torch.tensor(0.5))


def test_token_rejection_masks_tokens_outside_the_bounds_inclusive() -> None:
    # bounds [0.5, 2]: weights 1 (kept), 3 (rejected), 0.5 (kept: the bound is inside)
    trainer = torch.tensor([[LN(1.0), LN(3.0), LN(0.5)]])
    result = rollout_correction(trainer, torch.zeros(1, 3), torch.ones(1, 3), config(rejection="token"))
    assert result.weights is None
    assert result.keep.tolist() == [[True, False, True]]
    assert_close(result.metrics["rejected_fraction"], torch.tensor(1 / 3))
    assert_close(result.metrics["rejected_response_fraction"], torch.tensor(1.0))


@pytest.mark.parametrize(
    ("level", "kept_rows"),
    [
        # rows' token weights: (2, 2), (4, 1), (4, 4). geometric means 2, 2, 4 ; products 4, 4, 16
        ("geometric", [True, True, False]),
        ("sequence", [False, False, False]),
    ],
)
def test_sequence_level_rejection_drops_whole_responses(level: str, kept_rows: list[bool]) -> None:
    trainer = torch.tensor([[LN(2), LN(2)], [LN(4), LN(1)], [LN(4), LN(4)]])
    result = rollout_correction(trainer, torch.zeros(3, 2), torch.ones(3, 2), config(rejection=level))
    assert result.keep.tolist() == [[kept, kept] for kept in kept_rows]


def test_rejection_compares_in_log_space_beyond_the_exp_bound() -> None:
    # a weight of e^30 is far above 2 even though exp would stop at e^20; e^-30 far below 0.5
    trainer = torch.tensor([[30.0, -30.0, 0.0]])
    result = rollout_correction(trainer, torch.zeros(1, 3), torch.ones(1, 3), config("token", rejection="token"))
    assert result.keep.tolist() == [[False, False, True]]
    assert result.weights is not None and torch.isfinite(result.weights).all()


def test_padding_is_neither_weighed_nor_kept_and_garbage_there_changes_nothing() -> None:
    mask = torch.tensor([[1.0, 0.0]])
    clean = rollout_correction(torch.zeros(1, 2), torch.zeros(1, 2), mask, config("token", rejection="token"))
    dirty = rollout_correction(
        torch.tensor([[0.0, float("nan")]]), torch.tensor([[0.0, 50.0]]), mask, config("token", rejection="token")
    )
    assert dirty.weights is not None and clean.weights is not None
    assert_close(dirty.weights, clean.weights)
    assert dirty.weights[0, 1] == 0 and not dirty.keep[0, 1]
    for name, value in clean.metrics.items():
        assert_close(dirty.metrics[name], value, msg=name)


def test_weights_never_carry_a_gradient() -> None:
    trainer = torch.tensor([[0.3]], requires_grad=True)
    result = rollout_correction(trainer, torch.zeros(1, 1), torch.ones(1, 1), config("token"))
    assert result.weights is not None and not result.weights.requires_grad
