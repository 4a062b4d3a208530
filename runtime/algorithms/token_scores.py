"""What a forward pass gives of each response token, from the LM head's logits, a slice of rows at a time.

`token_scores` returns log softmax(z)[label] (the token's log-prob), and when asked the entropy of softmax(z) and
sum_v softmax(z)_v^2 (the token baselines' collision probability), z = logits / temperature, all in float32. These
are the same numbers as `losses.logprobs_from_logits` and `losses.entropy_from_logits` (the definitions, which the
tests compare against); what differs is memory. The logits are the largest activation of an update (vocabulary x
response tokens: 151,936 x 3,072 for a Qwen pass of 4 rows of 768, 0.9 GB in bf16), and computing in float32 over
them whole makes float32 copies of twice that size: the upcast, kept for the backward, and in the backward each
term's gradient. Here the float32 work is done on slices of `chunk_elements` and only the logits themselves and
three numbers a token are kept for the backward, which recomputes a slice's softmax from them (verl's
`entropy_from_logits_with_chunking` does the same for the entropy's forward). `head_token_scores` goes further,
as verl's fused kernels and Liger's fused cross-entropy do: it scores from the LM head's input and never makes the
logits whole (training.fusedLogProbs). `bench/token_scores.py` measures both ways.

The gradient, for one token with label y, p = softmax(z) and E = sum_v p_v z_v (so entropy = logsumexp(z) - E):

    d logprob / d z_v = [v = y] - p_v
    d entropy / d z_v = -p_v (z_v - E)

and d / d logits = (d / d z) / temperature, returned in the logits' dtype.
"""

import contextlib
import math
from typing import Any

import torch
from torch import Tensor

#: float32 elements of one slice, 2^26 (256 MiB): 441 tokens of a Qwen vocabulary; a padded pass's (m, R, V) logits
#: are sliced by whole rows, at least one
CHUNK_ELEMENTS = 1 << 26


def token_scores(
    logits: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
    sum_pi_squared: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs of `labels` (...,) under softmax(logits / temperature) for `logits` (..., V) in any float dtype,
    and when asked the distribution's entropy and sum_v pi(v)^2; each (...,) float32. A temperature <= 0 (greedy)
    scores the logits unscaled. The log-probs and the entropy carry gradients to `logits`; sum_pi_squared none.

    `labels` must be valid vocabulary ids everywhere (pad with the pad token id, not -100).

    >>> logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    >>> logprobs, entropy, squares = token_scores(logits, torch.tensor([0]), entropy=True, sum_pi_squared=True)
    >>> round(float(logprobs[0].exp()), 6), round(float(entropy[0]), 6), round(float(squares[0]), 6)
    (0.5, 1.039721, 0.375)
    """
    scale = temperature if temperature > 0 else 1.0
    per_row = max(1, math.prod(logits.shape[1:]))  # elements of one entry along dim 0: a token's or a row's
    rows = max(1, chunk_elements // per_row)
    logprobs, entropies, squares = _TokenScores.apply(logits, labels, scale, rows, entropy, sum_pi_squared)
    return logprobs, entropies if entropy else None, squares if sum_pi_squared else None


class _TokenScores(torch.autograd.Function):
    """`token_scores` over slices of `rows` entries of dim 0; see the module's docstring for the gradient."""

    @staticmethod
    def forward(  # type: ignore[override]  # autograd.Function's signature is per subclass
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        labels: Tensor,
        temperature: float,
        rows: int,
        entropy: bool,
        sum_pi_squared: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        scores = _Scores(labels, entropy, sum_pi_squared)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            scores.fill(part, _scaled(logits[part], temperature), labels[part])  # (c, ..., V) float32
        ctx.save_for_backward(logits, labels, scores.logsumexp, scores.expected)
        ctx.temperature, ctx.rows = temperature, rows  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(scores.squares)
        ctx.set_materialize_grads(False)  # an output nobody reads gets None: its term is skipped
        return scores.outputs()

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None, _: None
    ) -> tuple[Tensor | None, None, None, None, None, None]:
        logits, labels, logsumexp, expected = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature, rows = ctx.temperature, ctx.rows  # type: ignore[attr-defined]
        if not ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            return None, None, None, None, None, None
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)  # (..., V) in the logits' dtype
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            z = _scaled(logits[part], temperature, fresh=True)  # (c, ..., V), written below
            grads = _part(grad_logprobs, part), _part(grad_entropy, part)
            grad[part] = _logit_gradient(z, labels[part], logsumexp[part], _part(expected, part), *grads, temperature)
        return grad, None, None, None, None, None


def head_token_scores(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    *,
    compute_dtype: torch.dtype | None = None,
    entropy: bool = False,
    sum_pi_squared: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`token_scores` of the logits `hidden @ weight.T` (an LM head without bias), computed without them: a slice
    of tokens at a time, in forward and again in backward, which recomputes the slice's logits from `hidden`
    (..., H) and `weight` (V, H). `labels` (...,); the scores (...,) float32 each. The logits are made in
    `compute_dtype` (default the weight's; the autocast dtype under autocast, as the head would), then scored in
    float32 like `token_scores`'.

    Nothing of vocabulary size is kept beyond one slice of `chunk_elements` float32 logits, forward or backward
    (verl's `use_fused_kernels`, Liger's fused linear cross-entropy). The gradient of `weight` is accumulated over
    the slices in float32 and returned in the weight's dtype; the recomputation costs one more matmul of the head
    in backward.

    >>> hidden, weight = torch.eye(2), torch.log(torch.tensor([[0.5, 0.25], [0.25, 0.5], [0.25, 0.25]]))
    >>> logprobs, _, _ = head_token_scores(hidden, weight, torch.tensor([0, 1]))
    >>> [round(value, 6) for value in logprobs.exp().tolist()]
    [0.5, 0.5]
    """
    scale = temperature if temperature > 0 else 1.0
    tokens = max(1, chunk_elements // max(1, weight.shape[0]))  # tokens of one slice
    dtype = compute_dtype or weight.dtype
    flat_hidden, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)  # (N, H), (N,)
    logprobs, entropies, squares = _HeadScores.apply(
        flat_hidden, weight, flat_labels, scale, dtype, tokens, entropy, sum_pi_squared
    )
    shape = labels.shape
    return (
        logprobs.view(shape),
        entropies.view(shape) if entropy else None,
        squares.view(shape) if sum_pi_squared else None,
    )


class _HeadScores(torch.autograd.Function):
    """`head_token_scores` over slices of `tokens` rows of the (N, H) hidden states."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: Tensor,
        weight: Tensor,
        labels: Tensor,
        temperature: float,
        dtype: torch.dtype,
        tokens: int,
        entropy: bool,
        sum_pi_squared: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        with _without_autocast(hidden.device):  # the dtypes are chosen here
            head = weight.to(dtype)  # (V, H): the head in the compute dtype, cast once, as autocast's cache would
            scores = _Scores(labels, entropy, sum_pi_squared)
            for start in range(0, hidden.shape[0], tokens):
                part = slice(start, start + tokens)
                logits = hidden[part].to(dtype) @ head.T  # (c, V) in the compute dtype
                scores.fill(part, _scaled(logits, temperature), labels[part])
        ctx.save_for_backward(hidden, head, labels, scores.logsumexp, scores.expected)
        ctx.temperature, ctx.tokens, ctx.weight_dtype = temperature, tokens, weight.dtype  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(scores.squares)
        ctx.set_materialize_grads(False)
        return scores.outputs()

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None, _: None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None, None, None, None]:
        hidden, head, labels, logsumexp, expected = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature, tokens = ctx.temperature, ctx.tokens  # type: ignore[attr-defined]
        wants_hidden, wants_weight = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None  # (N, H)
        # summed over the slices in float32, then the weight's dtype
        grad_weight = torch.zeros(head.shape, dtype=torch.float32, device=head.device) if wants_weight else None
        with _without_autocast(hidden.device):
            for start in range(0, hidden.shape[0], tokens):
                part = slice(start, start + tokens)
                inputs = hidden[part].to(head.dtype)  # (c, H)
                z = _scaled(inputs @ head.T, temperature, fresh=True)  # (c, V) float32, written below
                grads = _part(grad_logprobs, part), _part(grad_entropy, part)
                dz = _logit_gradient(z, labels[part], logsumexp[part], _part(expected, part), *grads, temperature)
                d_logits = dz.to(head.dtype)  # (c, V): what the head's backward would be handed
                if grad_hidden is not None:
                    grad_hidden[part] = d_logits @ head  # (c, H)
                if grad_weight is not None:
                    _add_product(grad_weight, d_logits.T, inputs)  # (V, H)
        weight_grad = None if grad_weight is None else grad_weight.to(ctx.weight_dtype)  # type: ignore[attr-defined]
        return grad_hidden, weight_grad, None, None, None, None, None, None


class _Scores:
    """A forward's outputs, float32 (...,) each, filled a slice at a time: the log-probs, logsumexp(z) and, when
    asked, E_p[z] (the entropy is logsumexp - E) and sum_v p_v^2; an output not asked for is empty."""

    def __init__(self, labels: Tensor, entropy: bool, sum_pi_squared: bool) -> None:
        self.logsumexp = torch.empty(labels.shape, dtype=torch.float32, device=labels.device)
        self.logprobs = torch.empty_like(self.logsumexp)
        self.expected = torch.empty_like(self.logsumexp) if entropy else self.logsumexp.new_empty(0)
        self.squares = torch.empty_like(self.logsumexp) if sum_pi_squared else self.logsumexp.new_empty(0)

    def fill(self, part: slice, z: Tensor, labels: Tensor) -> None:
        """Score the slice `part` from its scaled float32 logits `z` (c, ..., V) and its `labels` (c, ...)."""
        self.logsumexp[part] = torch.logsumexp(z, dim=-1)
        self.logprobs[part] = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - self.logsumexp[part]
        if self.squares.numel():
            self.squares[part] = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * self.logsumexp[part])
        if self.expected.numel():
            self.expected[part] = torch.softmax(z, dim=-1).mul_(z).sum(-1)  # sum_v p_v z_v

    def outputs(self) -> tuple[Tensor, Tensor, Tensor]:
        entropies = self.logsumexp - self.expected if self.expected.numel() else self.logsumexp.new_empty(0)
        return self.logprobs, entropies, self.squares


#: vocabulary rows of a block of the head's gradient that is added in float32 at a time (`_add_product`)
BLOCK_ROWS = 1 << 14


def _add_product(total: Tensor, left: Tensor, right: Tensor) -> None:
    """total += left @ right, for a float32 `total` (V, H) and `left` (V, c), `right` (c, H) in any one dtype. A
    lower dtype's product is made and added a block of BLOCK_ROWS rows at a time: adding it whole would make a
    float32 copy of it, and a product of the whole head besides, each as large as the head."""
    if left.dtype == total.dtype:
        total.addmm_(left, right)
        return
    for start in range(0, total.shape[0], BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        total[block] += left[block] @ right  # (b, H) in the lower dtype, added in float32


def _without_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast off on `device`, where it has autocast (the meta device has none)."""
    if not torch.amp.is_autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def _part(values: Tensor | None, part: slice) -> Tensor | None:
    """A slice of an optional per-token tensor; None when it is None or empty (an output not asked for)."""
    return None if values is None or not values.numel() else values[part]


def _logit_gradient(
    z: Tensor,
    labels: Tensor,
    logsumexp: Tensor,
    expected: Tensor | None,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
) -> Tensor:
    """d/d logits of sum(g * logprob + g_H * entropy) for one slice, float32, written into `z`'s memory (the
    slice's scaled logits, (c, ..., V)); see the module's docstring."""
    entropy_term = None  # p_v (z_v - E) g_H, written into z's memory
    if grad_entropy is not None and expected is not None:
        # softmax(z) from z itself: in exp(z - logsumexp) logsumexp's rounding, times (z - E), is 10x the error
        p = torch.softmax(z, dim=-1)  # (c, ..., V)
        entropy_term = z.sub_(expected.unsqueeze(-1)).mul_(p).mul_(grad_entropy.unsqueeze(-1))
    else:  # the log-probs alone: softmax(z) in z's own memory, one pass
        p = z.sub_(logsumexp.unsqueeze(-1)).exp_()  # (c, ..., V)
    if grad_logprobs is not None:  # ([v = y] - p_v) g, written into p's memory
        g = grad_logprobs.unsqueeze(-1)  # (c, ..., 1)
        dz = p.mul_(-g).scatter_add_(-1, labels.unsqueeze(-1), g)
    else:
        dz = p.zero_()
    if entropy_term is not None:
        dz.sub_(entropy_term)
    return dz.div_(temperature) if temperature != 1.0 else dz


def _scaled(logits: Tensor, temperature: float, fresh: bool = False) -> Tensor:
    """logits / temperature in float32; the logits themselves when they are float32 already and the temperature 1,
    unless a `fresh` tensor is asked for (one the caller may write into)."""
    z = logits.float()
    if temperature != 1.0:
        return z / temperature
    return z.clone() if fresh and z is logits else z
