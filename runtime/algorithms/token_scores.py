"""What a forward pass gives of each response token, from the LM head's logits, a slice of rows at a time.

`token_scores` returns log softmax(z)[label] (the token's log-prob), and when asked the entropy of softmax(z) and
sum_v softmax(z)_v^2 (the token baselines' collision probability), z = logits / temperature, all in float32. These
are the same numbers as `losses.logprobs_from_logits` and `losses.entropy_from_logits` (the definitions, which the
tests compare against); what differs is memory. The logits are the largest activation of an update (vocabulary x
response tokens: 151,936 x 3,072 for a Qwen pass of 4 rows of 768, 0.9 GB in bf16), and computing in float32 over
them whole makes float32 copies of twice that size: the upcast, kept for the backward, and in the backward each
term's gradient. Here the float32 work is done on slices of `chunk_elements` and only the logits themselves and
three numbers a token are kept for the backward, which recomputes a slice's softmax from them (verl's
`entropy_from_logits_with_chunking` does the same for the entropy's forward; Liger's fused cross-entropy goes
further and never writes the logits at all). `bench/token_scores.py` measures both ways.

The gradient, for one token with label y, p = softmax(z) and E = sum_v p_v z_v (so entropy = logsumexp(z) - E):

    d logprob / d z_v = [v = y] - p_v
    d entropy / d z_v = -p_v (z_v - E)

and d / d logits = (d / d z) / temperature, returned in the logits' dtype.
"""

import math

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
        logsumexp = logits.new_empty(labels.shape, dtype=torch.float32)  # (...,)
        logprobs = torch.empty_like(logsumexp)  # (...,)
        expected = torch.empty_like(logsumexp) if entropy else logsumexp.new_empty(0)  # (...,) E_p[z]
        squares = torch.empty_like(logsumexp) if sum_pi_squared else logsumexp.new_empty(0)  # (...,)
        for start in range(0, logits.shape[0], rows):
            part = slice(start, start + rows)
            z = _scaled(logits[part], temperature)  # (c, ..., V) float32
            logsumexp[part] = torch.logsumexp(z, dim=-1)
            logprobs[part] = z.gather(-1, labels[part].unsqueeze(-1)).squeeze(-1) - logsumexp[part]
            if sum_pi_squared:
                squares[part] = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * logsumexp[part])
            if entropy:
                expected[part] = torch.softmax(z, dim=-1).mul_(z).sum(-1)  # sum_v p_v z_v
        ctx.save_for_backward(logits, labels, logsumexp, expected)
        ctx.temperature, ctx.rows = temperature, rows  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(squares)
        ctx.set_materialize_grads(False)  # an output nobody reads gets None: its term is skipped
        entropies = logsumexp - expected if entropy else logsumexp.new_empty(0)  # (...,)
        return logprobs, entropies, squares

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
            entropy_term = None  # p_v (z_v - E) g_H, written into z's memory
            if grad_entropy is not None and expected.numel():
                # softmax(z) from z itself: in exp(z - logsumexp) logsumexp's rounding, times (z - E), is 10x the error
                p = torch.softmax(z, dim=-1)  # (c, ..., V)
                entropy_term = z.sub_(expected[part].unsqueeze(-1)).mul_(p).mul_(grad_entropy[part].unsqueeze(-1))
            else:  # the log-probs alone: softmax(z) in z's own memory, one pass
                p = z.sub_(logsumexp[part].unsqueeze(-1)).exp_()  # (c, ..., V)
            if grad_logprobs is not None:  # ([v = y] - p_v) g, written into p's memory
                g = grad_logprobs[part].unsqueeze(-1)  # (c, ..., 1)
                dz = p.mul_(-g).scatter_add_(-1, labels[part].unsqueeze(-1), g)
            else:
                dz = p.zero_()
            if entropy_term is not None:
                dz.sub_(entropy_term)
            grad[part] = dz.div_(temperature) if temperature != 1.0 else dz
        return grad, None, None, None, None, None


def _scaled(logits: Tensor, temperature: float, fresh: bool = False) -> Tensor:
    """logits / temperature in float32; the logits themselves when they are float32 already and the temperature 1,
    unless a `fresh` tensor is asked for (one the caller may write into)."""
    z = logits.float()
    if temperature != 1.0:
        return z / temperature
    return z.clone() if fresh and z is logits else z
