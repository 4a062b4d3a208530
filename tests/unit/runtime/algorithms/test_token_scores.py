"""token_scores computes log-probs, entropies and sum_v pi(v)^2 from the logits a slice at a time: the numbers and
gradients of the definitions (losses.logprobs_from_logits, losses.entropy_from_logits), without ever holding a
float32 copy of the whole logits."""

import pytest
import torch
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from kuberl.runtime.algorithms.losses import entropy_from_logits, logprobs_from_logits
from kuberl.runtime.algorithms.token_scores import token_scores

V = 50


def definitions(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple[torch.Tensor, ...]:
    """The three scores as losses.py defines them, in float32 over the whole logits."""
    z = logits.float() / temperature  # (..., V)
    return logprobs_from_logits(z, labels), entropy_from_logits(z), torch.softmax(z, -1).pow(2).sum(-1)


def logits_and_labels(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(*shape, V, generator=generator) * 3).to(dtype)
    return logits, torch.randint(0, V, shape, generator=generator)


def exact(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple[torch.Tensor, ...]:
    """The three scores in float64, from log_softmax."""
    logp = torch.log_softmax(logits.double() / temperature, -1)  # (..., V)
    p = logp.exp()
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(p * logp).sum(-1), p.pow(2).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("shape", [(13,), (3, 5)], ids=["tokens", "rows"])
@pytest.mark.parametrize("asked", ["both", "logprobs", "entropy"])
def test_scores_and_gradients_equal_the_definitions(dtype, temperature, shape, asked) -> None:
    """Slices of 2 tokens or 1 row (chunk_elements = 2 x V), so every case crosses slices. The reference is the
    float64 computation."""
    logits, labels = logits_and_labels(shape, dtype)
    weights = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def scored(function, dtype: torch.dtype = dtype) -> tuple[list[torch.Tensor], torch.Tensor]:  # noqa: ANN001
        x = logits.to(dtype, copy=True).requires_grad_()
        scores = function(x)
        terms = [(score * weight).sum() for score, weight in zip(scores[:2], weights, strict=True)]
        loss = terms[0] + terms[1] if asked == "both" else terms[0] if asked == "logprobs" else terms[1]
        loss.backward()
        assert torch.equal(x.detach(), logits.to(dtype)), "the backward wrote into the logits"
        return [score.detach().double() for score in scores], x.grad

    ours, ours_grad = scored(
        lambda x: token_scores(x, labels, temperature, entropy=True, sum_pi_squared=True, chunk_elements=2 * V)
    )
    want, want_grad = scored(lambda x: exact(x, labels, temperature), torch.float64)
    for got, expected, name in zip(ours, want, ("logprobs", "entropy", "sum_pi_squared"), strict=True):
        assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=name)
    assert ours_grad.dtype == dtype
    # float32: the definitions in float32 are up to 4.4e-6 off; bf16: the gradient is rounded to 2^-8 relative
    rtol = 1e-5 if dtype == torch.float32 else 2**-7
    assert_close(ours_grad.double(), want_grad, rtol=rtol, atol=1e-5)


def test_without_a_temperature_the_logits_are_scored_unscaled() -> None:
    logits, labels = logits_and_labels((7,), torch.float32)
    for greedy in (0.0, -1.0):
        assert_close(token_scores(logits, labels, greedy)[0], logprobs_from_logits(logits, labels))


class VocabularyOps(TorchDispatchMode):
    """Records each op that makes a tensor with `vocab` columns (the logits and their copies): name, dtype, size.
    Views (a transpose of the (V, H) head, a slice) make no memory and are left out."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.made = vocab, list[tuple[str, torch.dtype, int]]()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() and out.shape[-1] == self.vocab and not func.is_view:
            self.made.append((func.overloadpacket.__name__, out.dtype, out.numel()))
        return out

    def largest(self, dtype: torch.dtype) -> int:
        return max((size for _, made, size in self.made if made == dtype), default=0)


@pytest.mark.parametrize("scorer", ["slices", "definitions"])
def test_no_float32_copy_of_the_whole_logits_is_made_forward_or_backward(scorer: str) -> None:
    """bf16 logits of 64 tokens in slices of 16: the float32 work never exceeds a slice. The definitions, on the
    other side, upcast all 64 at once (so the recorder sees what it is meant to)."""
    logits, labels = logits_and_labels((64,), torch.bfloat16)
    x = logits.requires_grad_()
    with VocabularyOps(V) as seen:
        if scorer == "slices":
            logprobs, entropy, _ = token_scores(x, labels, 0.7, entropy=True, chunk_elements=16 * V)
        else:
            logprobs, entropy, _ = definitions(x, labels, 0.7)
        (logprobs.sum() + entropy.sum()).backward()
    assert seen.largest(torch.float32) == (16 * V if scorer == "slices" else 64 * V)


def test_only_the_logits_and_three_numbers_a_token_are_kept_for_the_backward() -> None:
    logits, labels = logits_and_labels((64,), torch.bfloat16)
    kept: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        logprobs, entropy, _ = token_scores(logits.requires_grad_(), labels, 0.7, entropy=True, chunk_elements=16 * V)
    saved = sum(t.numel() * t.element_size() for t in kept)
    assert saved == logits.numel() * 2 + labels.numel() * 8 + 2 * 64 * 4  # bf16 logits, int64 labels, 2 floats


def test_scores_forward_and_backward_read_nothing_on_the_host() -> None:
    """On the meta device any read of a value on the host raises: the slices' loop and their backward read none, so
    on a GPU nothing waits for it (sizes come from shapes only)."""
    logits = torch.empty(64, V, device="meta", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.empty(64, device="meta", dtype=torch.long)
    logprobs, entropy, squares = token_scores(
        logits, labels, 0.7, entropy=True, sum_pi_squared=True, chunk_elements=16 * V
    )
    assert entropy is not None and squares is not None and not squares.requires_grad
    (logprobs.sum() + entropy.sum()).backward()
    assert logits.grad is not None and (logits.grad.device.type, logits.grad.dtype) == ("meta", torch.bfloat16)


def test_a_pass_without_tokens_scores_nothing() -> None:
    logits = torch.empty(0, V, requires_grad=True)
    logprobs, entropy, _ = token_scores(logits, torch.empty(0, dtype=torch.long), entropy=True)
    assert logprobs.shape == (0,) and entropy is not None and entropy.shape == (0,)
    (logprobs.sum() + entropy.sum()).backward()
    assert logits.grad is not None and logits.grad.shape == (0, V)
