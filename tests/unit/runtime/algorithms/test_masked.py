"""Masked statistics: only valid entries count, whatever the padding holds; empty masks give 0."""

import math

import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms.masked import masked_mean, masked_var, masked_whiten

NAN = float("nan")
# Valid entries 1, 2 (row 0) and 4 (row 1); the padding holds NaN to prove it is never read.
X = torch.tensor([[1.0, 2.0, NAN], [4.0, NAN, NAN]])  # (2, 3)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # (2, 3)


def test_masked_mean_over_everything() -> None:
    # (1 + 2 + 4) / 3
    assert_close(masked_mean(X, MASK), torch.tensor(7 / 3))


def test_masked_mean_along_a_dim() -> None:
    # row 0: (1 + 2) / 2 ; row 1: 4 / 1
    assert_close(masked_mean(X, MASK, dim=-1), torch.tensor([1.5, 4.0]))


def test_masked_mean_of_an_empty_mask_is_zero() -> None:
    assert_close(masked_mean(X, torch.zeros(2, 3)), torch.tensor(0.0))


def test_masked_var_unbiased_and_biased() -> None:
    # mean 7/3; deviations -4/3, -1/3, 5/3; squares sum (16 + 1 + 25)/9 = 42/9
    # unbiased: 42/9 / 2 = 7/3 ; biased: 42/9 / 3 = 14/9
    assert_close(masked_var(X, MASK), torch.tensor(7 / 3))
    assert_close(masked_var(X, MASK, unbiased=False), torch.tensor(14 / 9))


def test_masked_var_of_a_single_entry_is_zero_not_an_error() -> None:
    assert_close(masked_var(X, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])), torch.tensor(0.0))


def test_masked_whiten_centres_and_scales_valid_entries_and_zeroes_padding() -> None:
    # (x - 7/3) / sqrt(7/3)
    std = math.sqrt(7 / 3)
    expected = torch.tensor([[(1 - 7 / 3) / std, (2 - 7 / 3) / std, 0.0], [(4 - 7 / 3) / std, 0.0, 0.0]])  # (2, 3)
    assert_close(masked_whiten(X, MASK), expected)


def test_masked_whiten_without_shift_keeps_the_mean() -> None:
    whitened = masked_whiten(X, MASK, shift_mean=False)  # (2, 3)
    assert_close(masked_mean(whitened, MASK), torch.tensor(7 / 3))
    assert_close(masked_var(whitened, MASK), torch.tensor(1.0))
    assert (whitened[~MASK.bool()] == 0).all()
