"""head_token_scores scores the LM head's output from its input, a slice of tokens at a time: the numbers and the
gradients (of the hidden states and of the head's weight) of scoring `hidden @ weight.T`, without ever holding the
logits of more than one slice."""

import pytest
import torch
from torch.testing import assert_close

from kuberl.runtime.algorithms import token_scores as token_scores_module
from kuberl.runtime.algorithms.token_scores import head_token_scores, token_scores
from tests.unit.runtime.algorithms.test_token_scores import V, VocabularyOps, exact

H = 12


def head_case(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states (..., H), a head (V, H) and labels (...,): logits of about 3 standard deviations."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(*shape, H, generator=generator)
    weight = torch.randn(V, H, generator=generator)
    return hidden, weight, torch.randint(0, V, shape, generator=generator)


def weighted_loss(scores: tuple[torch.Tensor | None, ...], asked: str) -> torch.Tensor:
    """A loss with different weights per token, so a gradient that mixes tokens up is wrong."""
    weights = torch.randn(2, *scores[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    logprobs, entropy = (score.double() for score in scores[:2])  # type: ignore[union-attr]
    terms = {"logprobs": (logprobs * weights[0]).sum(), "entropy": (entropy * weights[1]).sum()}
    return sum(terms.values()) if asked == "both" else terms[asked]  # type: ignore[return-value]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("shape", [(13,), (3, 5)], ids=["tokens", "rows"])
@pytest.mark.parametrize("asked", ["both", "logprobs", "entropy"])
def test_scores_and_gradients_equal_scoring_the_logits(temperature, shape, asked) -> None:
    """float32 in slices of 2 tokens, so every case crosses slices (13 tokens: the last slice has one); the
    reference is the float64 computation over the whole logits."""
    hidden, weight, labels = head_case(shape)

    def scored(dtype: torch.dtype, fused: bool) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        x = hidden.to(dtype, copy=True).requires_grad_()
        w = weight.to(dtype, copy=True).requires_grad_()
        if fused:
            scores = head_token_scores(
                x, w, labels, temperature, entropy=True, sum_pi_squared=True, chunk_elements=2 * V
            )
        else:
            scores = exact(x @ w.T, labels, temperature)
        weighted_loss(scores, asked).backward()
        assert x.grad is not None and w.grad is not None
        return [score.detach().double() for score in scores if score is not None], x.grad, w.grad

    ours, ours_hidden, ours_weight = scored(torch.float32, fused=True)
    want, want_hidden, want_weight = scored(torch.float64, fused=False)
    for got, expected, name in zip(ours, want, ("logprobs", "entropy", "sum_pi_squared"), strict=True):
        assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)
    assert (ours_hidden.dtype, ours_weight.dtype) == (torch.float32, torch.float32)
    assert_close(ours_hidden.double(), want_hidden, rtol=1e-5, atol=1e-5)
    assert_close(ours_weight.double(), want_weight, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_rows", [7, token_scores_module.BLOCK_ROWS])
def test_in_a_lower_compute_dtype_it_matches_the_head_under_autocast(block_rows, monkeypatch) -> None:
    """A float32 head computing in bf16 (a single rank's autocast): the logits are the same bf16 products the head
    makes under autocast, so the scores match the logits path's. The gradients come back in float32, off the
    float64 truth by about as much as the head's own backward is: both round the logits' gradient to bf16; the
    head's rounds the weight's gradient once more, the slices round each slice's share and add them in float32
    (in blocks of 7 of the 50 vocabulary rows, or all at once)."""
    monkeypatch.setattr(token_scores_module, "BLOCK_ROWS", block_rows)
    hidden, weight, labels = head_case((40,))
    hidden = hidden * 0.3

    def scored(how: str) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        dtype = torch.float64 if how == "float64" else torch.float32
        x = hidden.to(dtype, copy=True).requires_grad_()
        w = weight.to(dtype, copy=True).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how != "float64"):
            if how == "slices":
                scores = head_token_scores(
                    x, w, labels, 0.7, compute_dtype=torch.bfloat16, entropy=True, chunk_elements=8 * V
                )
            else:
                logits = torch.nn.functional.linear(x, w)  # (40, V), what the model's head makes
                assert logits.dtype == (torch.float64 if how == "float64" else torch.bfloat16)
                scores = token_scores(logits, labels, 0.7, entropy=True)
        weighted_loss(scores, "both").backward()
        assert x.grad is not None and w.grad is not None
        return [score.detach().double() for score in scores[:2] if score is not None], x.grad, w.grad

    ours, ours_hidden, ours_weight = scored("slices")
    head, head_hidden, head_weight = scored("head")
    truth, true_hidden, true_weight = scored("float64")
    for got, expected in zip(ours, head, strict=True):
        assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (ours_hidden.dtype, ours_weight.dtype) == (torch.float32, torch.float32)

    def error(got: torch.Tensor, true: torch.Tensor) -> float:
        return float((got.double() - true).abs().max() / true.abs().max())

    assert error(ours_hidden, true_hidden) <= 1.5 * error(head_hidden, true_hidden)
    assert error(ours_weight, true_weight) <= 1.5 * error(head_weight, true_weight)
    assert error(ours_weight, true_weight) < 2**-6


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_do() -> None:
    """A LoRA actor's or a reference's head: only the hidden states want a gradient."""
    hidden, weight, labels = head_case((9,))
    x = hidden.clone().requires_grad_()
    logprobs, _, _ = head_token_scores(x, weight, labels, chunk_elements=4 * V)
    logprobs.sum().backward()
    assert weight.grad is None and x.grad is not None
    want = x.detach().clone().requires_grad_()
    token_scores(want @ weight.T, labels)[0].sum().backward()
    assert_close(x.grad, want.grad)


def test_no_logits_beyond_a_slice_are_made_forward_or_backward() -> None:
    """64 tokens in slices of 16: no tensor with a vocabulary's columns holds more than 16 tokens, in any dtype.
    The head over all of them, on the other side, makes all 64 tokens' logits at once."""
    hidden, weight, labels = head_case((64,))
    for fused in (True, False):
        x, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with VocabularyOps(V) as seen:
            if fused:
                logprobs, entropy, _ = head_token_scores(x, w, labels, 0.7, entropy=True, chunk_elements=16 * V)
            else:
                logprobs, entropy, _ = token_scores(x @ w.T, labels, 0.7, entropy=True, chunk_elements=16 * V)
            (logprobs.sum() + entropy.sum()).backward()  # type: ignore[union-attr]
        largest = max(size for _, _, size in seen.made)
        assert largest == (16 * V if fused else 64 * V)


def test_only_the_hidden_states_the_head_and_three_numbers_a_token_are_kept() -> None:
    """What the backward keeps: the (N, H) input and the (V, H) head it already had, not the (N, V) logits."""
    hidden, weight, labels = head_case((64,))
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        head_token_scores(hidden.requires_grad_(), weight.requires_grad_(), labels, entropy=True, chunk_elements=16 * V)
    assert sum(t.numel() * t.element_size() for t in kept) == (64 * H + V * H) * 4 + 64 * 8 + 2 * 64 * 4


def test_forward_and_backward_read_nothing_on_the_host() -> None:
    """On the meta device any host read of a value raises: on a GPU nothing waits for the slices' loop."""
    hidden = torch.empty(64, H, device="meta", dtype=torch.float32, requires_grad=True)
    weight = torch.empty(V, H, device="meta", dtype=torch.float32, requires_grad=True)
    labels = torch.empty(64, device="meta", dtype=torch.long)
    logprobs, entropy, squares = head_token_scores(
        hidden,
        weight,
        labels,
        0.7,
        compute_dtype=torch.bfloat16,
        entropy=True,
        sum_pi_squared=True,
        chunk_elements=16 * V,
    )
    assert entropy is not None and squares is not None and not squares.requires_grad
    (logprobs.sum() + entropy.sum()).backward()
    assert hidden.grad is not None and weight.grad is not None
    assert (hidden.grad.dtype, weight.grad.dtype, weight.grad.device.type) == (torch.float32, torch.float32, "meta")


def test_a_pass_without_tokens_scores_nothing() -> None:
    hidden, weight = torch.empty(0, H, requires_grad=True), torch.randn(V, H, requires_grad=True)
    logprobs, entropy, _ = head_token_scores(hidden, weight, torch.empty(0, dtype=torch.long), entropy=True)
    assert logprobs.shape == (0,) and entropy is not None and entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    assert hidden.grad is not None and hidden.grad.shape == (0, H)
    assert weight.grad is not None and not weight.grad.any()
