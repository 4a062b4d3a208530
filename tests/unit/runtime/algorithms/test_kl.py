"""Per-token KL estimators k1, k2, k3 against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from kuberl.api.enums import KLEstimator
from kuberl.runtime.algorithms.kl import kl_k1, kl_k2, kl_k3, kl_penalty
from kuberl.runtime.algorithms.registry import UnknownNameError

# Two tokens: the actor is more confident than the reference on the first, less on the second.
LOGPROBS = torch.tensor([[-1.0, -2.0]])  # (1, 2)
REF_LOGPROBS = torch.tensor([[-1.5, -1.0]])  # (1, 2)


def test_k1_is_the_log_ratio() -> None:
    # -1 - (-1.5) = 0.5 ; -2 - (-1) = -1
    assert_close(kl_k1(LOGPROBS, REF_LOGPROBS), torch.tensor([[0.5, -1.0]]))


def test_k2_is_half_the_squared_log_ratio() -> None:
    # 0.5 * 0.5^2 = 0.125 ; 0.5 * (-1)^2 = 0.5
    assert_close(kl_k2(LOGPROBS, REF_LOGPROBS), torch.tensor([[0.125, 0.5]]))


def test_k3_is_ratio_minus_one_minus_log_ratio() -> None:
    # log r = ref - logprobs = -0.5 and 1.0
    # e^-0.5 + 0.5 - 1 = 0.6065307 - 0.5 = 0.1065307 ; e^1 - 1 - 1 = 0.7182818
    expected = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0]])  # (1, 2)
    assert_close(kl_k3(LOGPROBS, REF_LOGPROBS), expected)


def test_k3_is_never_negative_and_zero_only_where_the_policies_agree() -> None:
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(64, 32, generator=generator) * 10  # (64, 32)
    ref_logprobs = -torch.rand(64, 32, generator=generator) * 10  # (64, 32)
    ref_logprobs[:, :4] = logprobs[:, :4]
    kl = kl_k3(logprobs, ref_logprobs)  # (64, 32)
    assert (kl >= 0).all()
    assert (kl[:, :4] == 0).all()
    assert (kl[:, 4:] > 0).all()


@pytest.mark.parametrize("log_ratio", [50.0, -50.0], ids=["reference-far-likelier", "actor-far-likelier"])
def test_k3_is_clamped_to_ten_for_extreme_log_ratios(log_ratio: float) -> None:
    # log r clamped to +-20: e^20 - 21 ~ 4.9e8 and e^-20 + 19 ~ 19, both then clamped to 10.
    kl = kl_k3(torch.tensor([[0.0]]), torch.tensor([[log_ratio]]))  # (1, 1)
    assert_close(kl, torch.tensor([[10.0]]))


@pytest.mark.parametrize(
    ("estimator", "function"),
    [("k1", kl_k1), ("k2", kl_k2), (KLEstimator.K3, kl_k3)],
)
def test_kl_penalty_dispatches_on_the_estimator_name(estimator: str, function) -> None:
    assert_close(kl_penalty(LOGPROBS, REF_LOGPROBS, estimator), function(LOGPROBS, REF_LOGPROBS))


def test_kl_penalty_with_an_unknown_estimator_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="unknown KL estimator 'low_var_kl'; known: k1, k2, k3"):
        kl_penalty(LOGPROBS, REF_LOGPROBS, "low_var_kl")
