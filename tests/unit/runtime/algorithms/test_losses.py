"""Loss aggregation, the PPO clip and value losses, and the logits helpers, against hand-derived numbers."""

import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from kuberl.runtime.algorithms.losses import (
    PolicyLossConfig,
    PolicyLossInputs,
    aggregate_loss,
    count_tokens_and_sequences,
    entropy_from_logits,
    logprobs_from_logits,
    policy_loss,
    value_loss,
)
from kuberl.runtime.algorithms.registry import LOSS_AGGREGATIONS, UnknownNameError

NAN = float("nan")

# ---------------------------------------------------------------- aggregation

# Row 0 has 3 valid tokens (losses 1, 2, 3), row 1 has one (loss 4); padding holds NaN.
TOKEN_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, NAN]])  # (2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # (2, 3)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq_mean_token_mean", 3.0),  # (6/3 + 4/1) / 2 sequences
        ("seq_mean_token_sum", 5.0),  # (6 + 4) / 2 sequences
        ("seq_mean_token_sum_norm", 1.25),  # (6 + 4) / (2 sequences * max length 4)
    ],
)
def test_aggregation_modes_by_hand(mode: str, expected: float) -> None:
    loss = aggregate_loss(TOKEN_LOSS, MASK, mode, max_response_length=4)
    assert_close(loss, torch.tensor(expected))


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS.names())
def test_a_sequence_with_no_valid_tokens_changes_nothing(mode: str) -> None:
    # An all-padding row (e.g. a dummy row that balances shards) is neither a token nor a sequence.
    padded_loss = torch.cat([TOKEN_LOSS, torch.full((1, 3), NAN)])  # (3, 3)
    padded_mask = torch.cat([MASK, torch.zeros(1, 3)])  # (3, 3)
    loss = aggregate_loss(padded_loss, padded_mask, mode, max_response_length=4)
    assert_close(loss, aggregate_loss(TOKEN_LOSS, MASK, mode, max_response_length=4))


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS.names())
def test_an_all_padding_batch_aggregates_to_zero(mode: str) -> None:
    loss = aggregate_loss(torch.full((2, 3), NAN), torch.zeros(2, 3), mode, max_response_length=4)
    assert_close(loss, torch.tensor(0.0))


def test_seq_mean_token_sum_norm_without_max_response_length_says_what_it_needs() -> None:
    with pytest.raises(ValueError, match="needs max_response_length"):
        aggregate_loss(TOKEN_LOSS, MASK, "seq_mean_token_sum_norm")


def test_unknown_aggregation_lists_the_known_modes() -> None:
    with pytest.raises(UnknownNameError, match="unknown loss aggregation 'mean'; known: seq_mean_token_mean"):
        aggregate_loss(TOKEN_LOSS, MASK, "mean")


def test_counts_are_valid_tokens_and_sequences_with_any_token() -> None:
    assert count_tokens_and_sequences(torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])) == (3, 2)


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS.names())
def test_shards_aggregated_with_global_counts_sum_to_the_whole_batch(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    token_loss = torch.randn(6, 5, generator=generator)  # (6, 5)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 1, 3, 0, 2, 4])[:, None]).float()  # (6, 5)
    tokens, seqs = count_tokens_and_sequences(mask)
    whole = aggregate_loss(token_loss, mask, mode, max_response_length=8)
    # Two data-parallel ranks with uneven shares: 6 tokens on rank 0, 9 on rank 1.
    shards = [
        aggregate_loss(
            token_loss[rows],
            mask[rows],
            mode,
            global_tokens=tokens,
            global_seqs=seqs,
            max_response_length=8,
        )
        for rows in (slice(0, 2), slice(2, 6))
    ]
    assert_close(shards[0] + shards[1], whole, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- PPO clip


def ppo_one_token(
    ratio: float, advantage: float, dual_clip_c: float | None = 3.0
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The loss and d loss / d logprob of one token; clip range [0.8, 1.2]."""
    old_logprobs = torch.tensor([[-1.0]])  # (1, 1)
    logprobs = torch.tensor([[-1.0 + math.log(ratio)]], requires_grad=True)  # (1, 1)
    inputs = PolicyLossInputs(logprobs, old_logprobs, torch.tensor([[advantage]]), torch.ones(1, 1))
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.2, dual_clip_c=dual_clip_c)
    loss, metrics = policy_loss("ppo_clip", inputs, config, "token_mean")
    loss.backward()
    assert logprobs.grad is not None
    return loss.detach(), logprobs.grad[0, 0], metrics


# loss = max(-A*r, -A*clip(r, 0.8, 1.2)), then for A < 0 min(that, -A*c) with c = 3;
# d loss / d logprob = -A*r where the unclipped term is chosen, else 0.
@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "expected_grad"),
    [
        pytest.param(1.1, 2.0, -2.2, -2.2, id="inside-clip-range"),  # -2*1.1 both terms
        pytest.param(1.5, 1.0, -1.2, 0.0, id="clipped-high-positive-advantage"),  # max(-1.5, -1.2)
        pytest.param(0.5, -1.0, 0.8, 0.0, id="clipped-low-negative-advantage"),  # max(0.5, 0.8)
        pytest.param(0.5, 1.0, -0.5, -0.5, id="low-ratio-positive-advantage-unclipped"),  # max(-0.5, -0.8)
        pytest.param(2.0, -1.0, 2.0, 2.0, id="negative-advantage-below-dual-bound"),  # min(max(2, 1.2), 3)
        pytest.param(math.exp(5), -0.5, 1.5, 0.0, id="dual-clip-bounds-huge-ratio"),  # min(0.5*148.4, 3*0.5)
    ],
)
def test_ppo_clip_token_loss_and_gradient(ratio: float, advantage: float, expected_loss: float, expected_grad: float):
    loss, grad, _ = ppo_one_token(ratio, advantage)
    assert_close(loss, torch.tensor(expected_loss))
    assert_close(grad, torch.tensor(expected_grad))


def test_ppo_without_dual_clip_leaves_negative_advantage_unbounded() -> None:
    # 0.5 * e^5 = 74.207
    loss, _, metrics = ppo_one_token(math.exp(5), -0.5, dual_clip_c=None)
    assert_close(loss, torch.tensor(0.5 * math.exp(5)))
    assert "dual_clip_fraction" not in metrics


def test_ppo_rejects_a_dual_clip_constant_not_above_one() -> None:
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_one_token(1.0, 1.0, dual_clip_c=1.0)


def test_ppo_metrics_are_detached_means_over_valid_tokens() -> None:
    # tokens: (r 1.1, A 2) inside ; (r 1.5, A 1) clipped high ; (r e^5, A -0.5) dual-clipped ; then padding
    old_logprobs = torch.zeros(1, 4)  # (1, 4)
    logprobs = torch.tensor([[math.log(1.1), math.log(1.5), 5.0, 30.0]], requires_grad=True)  # (1, 4)
    advantages = torch.tensor([[2.0, 1.0, -0.5, 7.0]])  # (1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # (1, 4)
    inputs = PolicyLossInputs(logprobs, old_logprobs, advantages, mask)
    loss, metrics = policy_loss("ppo_clip", inputs, PolicyLossConfig(dual_clip_c=3.0), "token_mean")
    loss.backward()
    assert logprobs.grad is not None
    # (-2.2 - 1.2 + 1.5) / 3 ; only the inside token has a gradient (-2.2), padding none
    assert_close(loss.detach(), torch.tensor(-1.9 / 3))
    assert_close(logprobs.grad, torch.tensor([[-2.2 / 3, 0.0, 0.0, 0.0]]))
    expected_metrics = {
        "clip_fraction": 1 / 3,  # the clipped-high token (the dual-clipped one has pg2 < pg1)
        "dual_clip_fraction": 1 / 3,
        "ratio_mean": (1.1 + 1.5 + math.exp(5)) / 3,
        "approx_kl": -(math.log(1.1) + math.log(1.5) + 5.0) / 3,  # mean of log pi_old - log pi
    }
    assert metrics.keys() == expected_metrics.keys()
    for name, value in expected_metrics.items():
        assert_close(metrics[name], torch.tensor(value), msg=name)
        assert not metrics[name].requires_grad


# ---------------------------------------------------------------- value loss


# old value 1.0, return 2.0, clip 0.2 -> the new value may move within [0.8, 1.2] before clipping bites.
@pytest.mark.parametrize(
    ("value", "clip", "expected_loss", "expected_grad", "clipped"),
    [
        pytest.param(1.1, 0.2, 0.405, -0.9, 0.0, id="inside-clip"),  # 0.5*(1.1-2)^2 ; grad v-R
        pytest.param(1.5, 0.2, 0.32, 0.0, 1.0, id="clipped"),  # 0.5*max((1.5-2)^2, (1.2-2)^2) = 0.5*0.64
        pytest.param(1.5, None, 0.125, -0.5, 0.0, id="unclipped"),  # 0.5*(1.5-2)^2
    ],
)
def test_value_loss(value: float, clip: float | None, expected_loss: float, expected_grad: float, clipped: float):
    values = torch.tensor([[value, 0.0]], requires_grad=True)  # (1, 2) second token is padding
    loss, metrics = value_loss(
        values,
        torch.tensor([[1.0, 5.0]]),
        torch.tensor([[2.0, -5.0]]),
        torch.tensor([[1.0, 0.0]]),
        clip=clip,
        aggregation="token_mean",
    )
    loss.backward()
    assert values.grad is not None
    assert_close(loss.detach(), torch.tensor(expected_loss))
    assert_close(values.grad, torch.tensor([[expected_grad, 0.0]]))
    assert_close(metrics["value_clip_fraction"], torch.tensor(clipped))


# ---------------------------------------------------------------- logits helpers


def test_entropy_by_hand() -> None:
    # uniform over 4: ln 4 ; probs 1/4, 3/4 (logits 0, ln 3): -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e4, -1e4]])  # (2, 4)
    expected = torch.tensor([math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))])  # (2,)
    assert_close(entropy_from_logits(logits), expected)


def test_entropy_of_a_huge_logit_is_zero_not_nan() -> None:
    assert_close(entropy_from_logits(torch.tensor([[1000.0, 0.0, 0.0]])), torch.tensor([0.0]))


def test_entropy_matches_torch_categorical_in_float32_for_bf16_logits() -> None:
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)).bfloat16()  # (2, 3, 11)
    entropy = entropy_from_logits(logits)  # (2, 3)
    assert entropy.dtype == torch.float32
    assert_close(entropy, torch.distributions.Categorical(logits=logits.float()).entropy())


def test_logprobs_by_hand() -> None:
    # row 0: logits 0, 0, ln 2 -> probs 1/4, 1/4, 1/2; label 2 -> ln 1/2. row 1: uniform; label 0 -> ln 1/3
    logits = torch.tensor([[[0.0, 0.0, math.log(2)], [0.0, 0.0, 0.0]]])  # (1, 2, 3)
    labels = torch.tensor([[2, 0]])  # (1, 2)
    assert_close(logprobs_from_logits(logits, labels), torch.tensor([[math.log(0.5), math.log(1 / 3)]]))


def test_logprobs_match_log_softmax_and_come_back_float32() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 11, generator=generator) * 30).bfloat16()  # (2, 3, 11)
    labels = torch.randint(0, 11, (2, 3), generator=generator)  # (2, 3)
    logprobs = logprobs_from_logits(logits, labels)  # (2, 3)
    expected = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None])[..., 0]  # (2, 3)
    assert logprobs.dtype == torch.float32
    assert_close(logprobs, expected)
