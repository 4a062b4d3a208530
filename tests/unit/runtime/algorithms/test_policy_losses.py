"""Every policy loss: hand-derived cases, verl's formula on random inputs, and the properties all losses keep.

The hand cases work the numbers out in comments; `verl_reference` restates verl's formulas, which the
random-input tests hold kuberl's to (loss and gradient, float32 precision).
"""

import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from kuberl.api import PolicyLoss
from kuberl.runtime.algorithms.losses import PolicyLossConfig, PolicyLossInputs, count_tokens_and_sequences, policy_loss
from kuberl.runtime.algorithms.registry import POLICY_LOSSES
from tests.unit.runtime.algorithms import verl_reference as verl

LN = math.log


def loss_and_grad(
    name: str,
    logprobs: list[list[float]],
    advantages: list[list[float]],
    old_logprobs: list[list[float]] | None = None,
    mask: list[list[float]] | None = None,
    aggregation: str = "token_mean",
    **knobs: float,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The aggregated loss, d loss / d logprobs, and the metrics."""
    new = torch.tensor(logprobs, requires_grad=True)  # (n, R)
    old = torch.zeros_like(new) if old_logprobs is None else torch.tensor(old_logprobs)  # (n, R)
    valid = torch.ones_like(new) if mask is None else torch.tensor(mask)  # (n, R)
    inputs = PolicyLossInputs(new, old, torch.tensor(advantages), valid)
    loss, metrics = policy_loss(name, inputs, PolicyLossConfig(**knobs), aggregation)
    loss.backward()
    assert new.grad is not None
    return loss.detach(), new.grad, metrics


# ---------------------------------------------------------------- hand-derived cases


def test_gspo_uses_the_geometric_mean_ratio_of_the_response_and_its_gradient() -> None:
    # old log-probs 0, new ln 1.2 and ln 0.8: s = exp((ln 1.2 + ln 0.8) / 2) = sqrt(0.96) = 0.979796, inside [0.8, 1.2].
    # Both tokens carry -A s = -0.979796; seq_mean_token_mean: one response -> loss -0.979796.
    # d/d logprob_t = -A s / |y| = -0.489898 (GSPO's gradient: A * grad s_i = A s_i mean_t grad log pi_t)
    loss, grad, _ = loss_and_grad("gspo", [[LN(1.2), LN(0.8)]], [[1.0, 1.0]], aggregation="seq_mean_token_mean")
    assert_close(loss, torch.tensor(-math.sqrt(0.96)))
    assert_close(grad, torch.full((1, 2), -math.sqrt(0.96) / 2))


def test_gspo_clips_the_whole_response_when_its_sequence_ratio_leaves_the_range() -> None:
    # s = exp((ln 2 + ln 2) / 2) = 2 > 1.2 with A = 1: the clipped term -1.2 wins, no gradient
    loss, grad, metrics = loss_and_grad("gspo", [[LN(2.0), LN(2.0)]], [[1.0, 1.0]], aggregation="seq_mean_token_mean")
    assert_close(loss, torch.tensor(-1.2))
    assert_close(grad, torch.zeros(1, 2))
    assert_close(metrics["clip_fraction"], torch.tensor(1.0))


def test_cispo_keeps_the_gradient_of_a_clipped_token() -> None:
    # r = 1.5 is above 1 + 0.28, so w = sg(1.28); loss = -w A log pi = -1.28 * 2 * ln 1.5 = -1.037991
    # d/d log pi = -w A = -2.56: PPO's clip would have given 0 here
    loss, grad, metrics = loss_and_grad("cispo", [[LN(1.5)]], [[2.0]], clip_low=0.2, clip_high=0.28)
    assert_close(loss, torch.tensor(-1.28 * 2 * LN(1.5)))
    assert_close(grad, torch.tensor([[-2.56]]))
    assert_close(metrics["clip_fraction"], torch.tensor(1.0))


def test_cispo_without_a_lower_bound_weighs_a_small_ratio_by_itself() -> None:
    # clipRatioLow 1: the bound 1 - 1 = 0 never bites. r = 0.5, A = -1: w = 0.5,
    # loss = -0.5 * (-1) * ln 0.5 = -0.346574 ; d/d log pi = -w A = 0.5
    loss, grad, metrics = loss_and_grad("cispo", [[LN(0.5)]], [[-1.0]], clip_low=1.0, clip_high=0.28)
    assert_close(loss, torch.tensor(0.5 * LN(0.5)))
    assert_close(grad, torch.tensor([[0.5]]))
    assert_close(metrics["clip_fraction"], torch.tensor(0.0))


def test_gpg_is_the_plain_policy_gradient() -> None:
    # loss = -A log pi = -2 * -0.5 = 1 ; d/d log pi = -A = -2 ; the old log-probs play no part
    loss, grad, _ = loss_and_grad("gpg", [[-0.5]], [[2.0]], old_logprobs=[[-3.0]])
    assert_close(loss, torch.tensor(1.0))
    assert_close(grad, torch.tensor([[-2.0]]))


def test_sapo_gate_at_ratio_one_is_two_over_tau_with_slope_one() -> None:
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau ; at r = 1: f = 0.5 * 4 / 1 = 2, so loss = -2 A = -2
    # d/d log pi = -A f'(1) r = -A * (sigmoid'(0) * tau * 4 / tau) * 1 = -A * 0.25 * 4 = -1
    loss, grad, _ = loss_and_grad("sapo", [[0.0]], [[1.0]], tau_positive=1.0, tau_negative=1.05)
    assert_close(loss, torch.tensor(-2.0))
    assert_close(grad, torch.tensor([[-1.0]]))


def test_sapo_negative_advantage_uses_tau_negative() -> None:
    # r = e^0.5 = 1.648721, A = -1, tau = 1.05: x = 1.05 * 0.648721 = 0.681157, sigmoid(x) = 0.663996
    # loss = -f A = f = 0.663996 * 4 / 1.05 = 2.529509
    # d/d log pi = -A * sigmoid(x)(1 - sigmoid(x)) * 4 * r = 0.663996 * 0.336004 * 4 * 1.648721 = 1.471302
    r, tau = math.exp(0.5), 1.05
    s = 1 / (1 + math.exp(-tau * (r - 1)))
    loss, grad, _ = loss_and_grad("sapo", [[0.5]], [[-1.0]], tau_positive=1.0, tau_negative=tau)
    assert_close(loss, torch.tensor(s * 4 / tau))
    assert_close(grad, torch.tensor([[s * (1 - s) * 4 * r]]))


def test_geo_mean_clips_in_log_space_on_the_harmful_side_only() -> None:
    # A = 1: log r = 0.1, 0.5 with clip [-0.4, 0.4] -> the smaller of (log r, clipped): 0.1, 0.4
    # ratio = exp((0.1 + 0.4) / 2) = exp(0.25) = 1.284025 ; loss = -mean(A) * ratio = -1.284025
    # d/d log pi_0 = -exp(0.25) / 2 = -0.642013 ; the clipped token 1 has none
    loss, grad, metrics = loss_and_grad(
        "geo_mean", [[0.1, 0.5]], [[1.0, 1.0]], aggregation="seq_mean_token_mean", clip_low=0.4, clip_high=0.4
    )
    assert_close(loss, torch.tensor(-math.exp(0.25)))
    assert_close(grad, torch.tensor([[-math.exp(0.25) / 2, 0.0]]))
    assert_close(metrics["clip_fraction"], torch.tensor(0.5))


def test_geo_mean_negative_advantage_bounds_the_ratio_from_below() -> None:
    # A = -1: log r = -0.1, -0.6; for A < 0 the larger of (log r, clipped) counts: -0.1, -0.4
    # ratio = exp(-0.25) = 0.778801 ; loss = -(-1) * 0.778801 ; d/d log pi_0 = 0.778801 / 2, token 1: 0
    loss, grad, metrics = loss_and_grad(
        "geo_mean", [[-0.1, -0.6]], [[-1.0, -1.0]], aggregation="seq_mean_token_mean", clip_low=0.4, clip_high=0.4
    )
    assert_close(loss, torch.tensor(math.exp(-0.25)))
    assert_close(grad, torch.tensor([[math.exp(-0.25) / 2, 0.0]]))
    assert_close(metrics["clip_fraction_lower"], torch.tensor(0.5))


# Four tokens, ratio 1 everywhere (nothing clipped by the ratio). A = 3, -1, -1, -1 (mean 0);
# log pi = -0.5, -1.5, -1.5, -1.5 (mean -1.25). cov = A_c * logpi_c = 3 * 0.75, -1 * -0.25 (x3)
#                                                                  = 2.25, 0.25, 0.25, 0.25
COV_ADVANTAGES = [[3.0, -1.0, -1.0, -1.0]]
COV_LOGPROBS = [[-0.5, -1.5, -1.5, -1.5]]


def test_clip_cov_detaches_the_token_whose_covariance_is_in_the_band() -> None:
    # band (1, 5): only token 0 (2.25); max(int(0.0002 * 4), 1) = 1 token is drawn -> token 0.
    # token losses -A r = -3, 1, 1, 1 with token 0 zeroed: token_mean = (0 + 1 + 1 + 1) / 4 = 0.75
    # gradients: token 0 none; others -A r / 4 = 0.25
    loss, grad, metrics = loss_and_grad("clip_cov", COV_LOGPROBS, COV_ADVANTAGES, old_logprobs=COV_LOGPROBS)
    assert_close(loss, torch.tensor(0.75))
    assert_close(grad, torch.tensor([[0.0, 0.25, 0.25, 0.25]]))
    assert_close(metrics["cov_clip_fraction"], torch.tensor(0.25))


def test_kl_cov_penalises_the_token_with_the_largest_covariance() -> None:
    # old log pi_0 = -0.7, so log r = 0.2, 0, 0, 0. The top max(int(0.0002 * 4), 1) = 1 covariance is token 0:
    # its loss is -3 e^0.2 + 1 * |0.2| = -3.464208 ; others -A = 1 ; token_mean = (-3.464208 + 3) / 4 = -0.116052
    # gradients: token 0 (-3 e^0.2 + 1) / 4 = -0.666052 ; others 1 / 4
    old = [[-0.7, -1.5, -1.5, -1.5]]
    loss, grad, metrics = loss_and_grad("kl_cov", COV_LOGPROBS, COV_ADVANTAGES, old_logprobs=old, kl_cov_coef=1.0)
    assert_close(loss, torch.tensor((-3 * math.exp(0.2) + 0.2 + 3) / 4))
    assert_close(grad, torch.tensor([[(-3 * math.exp(0.2) + 1) / 4, 0.25, 0.25, 0.25]]))
    assert_close(metrics["kl_cov_fraction"], torch.tensor(0.25))


def test_importance_weights_multiply_the_token_loss() -> None:
    # ppo_clip inside the range: -A r = -1 per token; weights 2 and 0.5 -> token_mean (-2 - 0.5) / 2 = -1.25
    new = torch.zeros(1, 2, requires_grad=True)
    inputs = PolicyLossInputs(new, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.tensor([[2.0, 0.5]]))
    loss, _ = policy_loss("ppo_clip", inputs, PolicyLossConfig(), "token_mean")
    assert_close(loss, torch.tensor(-1.25))


def test_geo_mean_weighs_a_response_by_the_geometric_mean_of_its_correction_weights() -> None:
    # On policy (ratio 1) with A = 1: uncorrected, the response's loss is -mean_t(A) * exp(0) = -1.
    # Weights 1/9 and 1 on its two tokens: geometric mean exp((ln(1/9) + ln 1) / 2) = exp(-ln 3) = 1/3
    # (their arithmetic mean would be 5/9), so the loss is -1/3: a third of the uncorrected one.
    # d/d log pi_t = -A * s * w / |y| = -1 * 1 * (1/3) / 2 = -1/6 on each token. The padding token's weight
    # (100) plays no part.
    new = torch.zeros(1, 3, requires_grad=True)  # (1, 3)
    weights = torch.tensor([[1 / 9, 1.0, 100.0]])  # (1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # (1, 3)
    inputs = PolicyLossInputs(new, torch.zeros(1, 3), torch.ones(1, 3), mask, weights)
    loss, _ = policy_loss("geo_mean", inputs, PolicyLossConfig(), "seq_mean_token_mean")
    loss.backward()
    assert_close(loss.detach(), torch.tensor(-1 / 3))
    assert_close(new.grad, torch.tensor([[-1 / 6, -1 / 6, 0.0]]))


# ---------------------------------------------------------------- verl's formulas on random inputs


def random_batch(seed: int, n: int = 6, width: int = 5) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(old, new, advantages, mask); every row has at least one token (verl's seq-mean averages all rows)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=generator)  # (n,)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # (n, width)
    old = -torch.rand(n, width, generator=generator) * 3  # (n, width)
    new = old + torch.randn(n, width, generator=generator) * 0.3  # (n, width) ratios around 1, some clipped
    advantages = torch.randn(n, 1, generator=generator).expand(n, width) * mask  # (n, width) one per response
    return old, new, advantages.contiguous(), mask


def kuberl_and_grad(name: str, batch: tuple, aggregation: str, config: PolicyLossConfig, seed: int = 0):
    old, new, advantages, mask = batch
    logprobs = new.clone().requires_grad_(True)
    loss, _ = policy_loss(name, PolicyLossInputs(logprobs, old, advantages, mask, seed=seed), config, aggregation)
    loss.backward()
    return loss.detach(), logprobs.grad


def verl_and_grad(formula, batch: tuple, *args):
    old, new, advantages, mask = batch
    logprobs = new.clone().requires_grad_(True)
    loss = formula(old, logprobs, advantages, mask, *args)
    loss.backward()
    return loss.detach(), logprobs.grad


CONFIG = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0, kl_cov_ratio=0.2, kl_cov_coef=0.5)
VERL_CASES = [
    ("ppo_clip", "token_mean", lambda *b: verl.vanilla(*b, 0.2, 0.28, 3.0, "token-mean")),
    ("ppo_clip", "seq_mean_token_mean", lambda *b: verl.vanilla(*b, 0.2, 0.28, 3.0, "seq-mean-token-mean")),
    ("gspo", "seq_mean_token_mean", lambda *b: verl.gspo(*b, 0.2, 0.28)),
    ("cispo", "token_mean", lambda *b: verl.cispo(*b, 0.2, 0.28, "token-mean")),
    ("gpg", "token_mean", lambda *b: verl.gpg_loss(*b, "token-mean")),
    ("geo_mean", "seq_mean_token_mean", lambda *b: verl.geo_mean(*b, 0.2, 0.28)),
    ("sapo", "seq_mean_token_mean", lambda *b: verl.sapo(*b, 1.0, 1.05)),
    ("kl_cov", "token_mean", lambda *b: verl.kl_cov(*b, 0.2, 0.5, "token-mean")),
]


@pytest.mark.parametrize(("name", "aggregation", "formula"), VERL_CASES, ids=[f"{c[0]}-{c[1]}" for c in VERL_CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_verls_formula_on_random_inputs(name: str, aggregation: str, formula, seed: int) -> None:
    batch = random_batch(seed)
    loss, grad = kuberl_and_grad(name, batch, aggregation, CONFIG)
    expected_loss, expected_grad = verl_and_grad(formula, batch)
    assert_close(loss, expected_loss)
    assert_close(grad, expected_grad)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_cov_equals_verls_formula_with_the_same_draw(seed: int) -> None:
    # a wide band and a large ratio, so that several candidates compete for the draw
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28, clip_cov_ratio=0.2, clip_cov_lower=-1.0, clip_cov_upper=5.0)
    batch = random_batch(seed)
    loss, grad = kuberl_and_grad("clip_cov", batch, "token_mean", config, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    expected_loss, expected_grad = verl_and_grad(
        verl.clip_cov, batch, 0.2, 0.28, 0.2, -1.0, 5.0, "token-mean", generator
    )
    assert_close(loss, expected_loss)
    assert_close(grad, expected_grad)


# ---------------------------------------------------------------- properties every loss keeps

AGGREGATION_OF = {"gspo": "seq_mean_token_mean", "geo_mean": "seq_mean_token_mean"}


def aggregation_for(name: str) -> str:
    return AGGREGATION_OF.get(name, "token_mean")


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_padding_content_and_width_change_nothing(name: str) -> None:
    old, new, advantages, mask = random_batch(3)
    loss, grad = kuberl_and_grad(name, (old, new, advantages, mask), aggregation_for(name), CONFIG)
    # two more padding columns and an all-padding row, all holding wild (finite) values
    wide = [torch.cat([t, torch.full((t.shape[0], 2), fill)], 1) for t, fill in ((old, -7.0), (new, 4.0))]
    wide = [torch.cat([t, torch.full((1, t.shape[1]), 5.0)]) for t in wide]
    wide_adv = torch.cat([torch.cat([advantages, torch.full((6, 2), 9.0)], 1), torch.full((1, 7), 9.0)])
    wide_mask = torch.cat([torch.cat([mask, torch.zeros(6, 2)], 1), torch.zeros(1, 7)])
    padded_loss, padded_grad = kuberl_and_grad(name, (*wide, wide_adv, wide_mask), aggregation_for(name), CONFIG)
    assert_close(padded_loss, loss)
    assert_close(padded_grad[:6, :5] * mask, grad * mask)
    assert (padded_grad[wide_mask == 0] == 0).all()


#: These two choose tokens within each micro-batch (by covariance), as verl does: not shard-invariant.
SELECTS_WITHIN_MICRO_BATCH = {PolicyLoss.CLIP_COV.value, PolicyLoss.KL_COV.value}


@pytest.mark.parametrize("name", sorted(set(POLICY_LOSSES.names()) - SELECTS_WITHIN_MICRO_BATCH))
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_with_global_counts_sum_to_the_whole_batch(name: str, aggregation: str) -> None:
    if name in AGGREGATION_OF and aggregation != AGGREGATION_OF[name]:
        pytest.skip(f"{name} runs with {AGGREGATION_OF[name]} only (api rule)")
    old, new, advantages, mask = random_batch(4)
    whole = new.clone().requires_grad_(True)
    expected, _ = policy_loss(
        name, PolicyLossInputs(whole, old, advantages, mask), CONFIG, aggregation, max_response_length=8
    )
    expected.backward()
    tokens, seqs = count_tokens_and_sequences(mask)
    parts = new.clone().requires_grad_(True)
    total = torch.tensor(0.0)
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):  # uneven: as ranks x micro-batches
        inputs = PolicyLossInputs(parts[rows], old[rows], advantages[rows], mask[rows])
        part, _ = policy_loss(
            name, inputs, CONFIG, aggregation, global_tokens=tokens, global_seqs=seqs, max_response_length=8
        )
        total = total + part
    total.backward()
    assert_close(total.detach(), expected.detach())
    assert_close(parts.grad, whole.grad)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_on_policy_every_loss_pushes_up_positive_advantage_tokens(name: str) -> None:
    # ratio 1 (one epoch over one mini-batch): each loss's gradient must raise log pi where A > 0 and lower it
    # where A < 0 (gradient descent moves log pi against the gradient's sign)
    _, grad = kuberl_and_grad(
        name,
        (torch.full((1, 2), -1.0), torch.full((1, 2), -1.0), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)),
        aggregation_for(name),
        PolicyLossConfig(clip_cov_ratio=1e-9, kl_cov_ratio=1e-9),
    )
    assert (grad < 0).all(), grad
    _, grad = kuberl_and_grad(
        name,
        (torch.full((1, 2), -1.0), torch.full((1, 2), -1.0), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)),
        aggregation_for(name),
        PolicyLossConfig(clip_cov_ratio=1e-9, kl_cov_ratio=1e-9),
    )
    assert (grad > 0).all(), grad


def test_metrics_come_back_detached() -> None:
    for name in POLICY_LOSSES.names():
        batch = random_batch(5)
        old, new, advantages, mask = batch
        inputs = PolicyLossInputs(new.clone().requires_grad_(True), old, advantages, mask)
        _, metrics = policy_loss(name, inputs, CONFIG, aggregation_for(name))
        assert metrics and all(not value.requires_grad for value in metrics.values()), name
