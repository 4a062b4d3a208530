"""The LM head as a scorer (training.fusedLogProbs): a trainer's forward pass returns, in the logits' place, each
scored token's log-prob (and when asked the entropy and sum_v pi(v)^2) computed from the head's input a slice of
tokens at a time (`algorithms.token_scores.head_token_scores`), so the pass's logits are never made whole.

The logits are the largest activation of a pass (vocabulary x scored tokens: 151,936 x 3,072 for 4 rows of 768
response tokens, 0.9 GB in bf16), and an update keeps them for its backward and makes their gradient, as large
again. Scored from the hidden states, a pass holds one slice of float32 logits at a time, forward and backward;
the backward computes a slice's logits once more (one more matmul of the head). verl: use_fused_kernels.

The head's forward is swapped for one forward pass (`scoring_head`), so the scores are made inside the model's
forward: under FSDP2 the head's weight is gathered there, as for the head itself, and the forward's output, which
FSDP2 hooks for the backward, is the scores. A model whose forward changes the head's output (a logit scale,
softcapping, a vocabulary cut: Gemma 2, Cohere, Granite) would score the wrong logits: the trainer checks that the
output it gets back is the scores the head made (`scores_out_of`), and says so at the first pass otherwise.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kuberl.runtime.algorithms.token_scores import CHUNK_ELEMENTS, head_token_scores
from kuberl.runtime.models.lora import model_name, transformers_model

FIELD = "training.fusedLogProbs"


@dataclass(frozen=True)
class HeadScoring:
    """What one forward pass scores: `labels`, the tokens predicted by the first positions the head is handed
    ((m, R) for padded rows, whose head sees R + 1 positions; (1, K) for a packed pass's K predicting positions),
    under the temperature-scaled distribution; the entropy and sum_v pi(v)^2 when asked."""

    labels: Tensor
    temperature: float
    entropy: bool = False
    sum_pi_squared: bool = False

    def split(self, columns: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The log-probs, entropies and sums of squares (..., each) out of the head's (..., k) columns."""
        entropies = columns[..., 1] if self.entropy else None
        squares = columns[..., -1] if self.sum_pi_squared else None
        return columns[..., 0], entropies, squares


def output_head(model: Any) -> Any:
    """The LM head of a transformers model, or of a PEFT model's base; None for a model without one (a critic)."""
    get_output_embeddings = getattr(transformers_model(model), "get_output_embeddings", None)
    return get_output_embeddings() if callable(get_output_embeddings) else None


def why_head_cannot_score(model: Any, takes_logits_to_keep: bool) -> str | None:
    """Why `model`'s head cannot score a forward pass's tokens (None when it can): it must be a plain linear layer
    without bias, and the forward must take `logits_to_keep` (the head then sees only the scored positions)."""
    head = output_head(model)
    name = model_name(model)
    if head is None:
        return f"{name} has no LM head (get_output_embeddings() is None)"
    if type(head) is not torch.nn.Linear:
        return f"{name}'s LM head is a {type(head).__module__}.{type(head).__name__}, not a plain torch.nn.Linear"
    if head.bias is not None:
        return f"{name}'s LM head has a bias"
    if not takes_logits_to_keep:
        return f"{name}'s forward does not take logits_to_keep"
    return None


@contextlib.contextmanager
def scoring_head(head: torch.nn.Linear, scoring: HeadScoring) -> Iterator[list[Tensor]]:
    """Within: `head`'s forward returns the (..., k) float32 columns of `scoring` (the log-prob, then the entropy
    and sum_v pi(v)^2 when asked) for the first `scoring.labels.shape[1]` positions it is handed, instead of the
    logits. The block yields the list of what the head returned, for `scores_out_of`."""
    made: list[Tensor] = []

    def forward(hidden: Tensor) -> Tensor:
        hidden = hidden[:, : scoring.labels.shape[1]]  # (m, R, H) of the R + 1 kept; (1, K, H) packed
        device = hidden.device.type
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        logprobs, entropies, squares = head_token_scores(
            hidden,
            head.weight,
            scoring.labels,
            scoring.temperature,
            compute_dtype=torch.get_autocast_dtype(device) if autocast else head.weight.dtype,
            entropy=scoring.entropy,
            sum_pi_squared=scoring.sum_pi_squared,
            chunk_elements=CHUNK_ELEMENTS,
        )
        columns = torch.stack([score for score in (logprobs, entropies, squares) if score is not None], dim=-1)
        made.append(columns)
        return columns

    head.forward = forward  # type: ignore[method-assign,assignment]  # this instance's, for the block
    try:
        yield made
    finally:
        del head.forward


def scores_out_of(logits: Tensor, made: list[Tensor], model: Any) -> Tensor:
    """The forward's output `logits`, checked to be the scores the head made in the block: a model that changed
    them after the head (a logit scale, softcapping) is refused, naming the field that asked for scoring."""
    if len(made) != 1 or logits is not made[0]:
        raise ValueError(
            f"{FIELD}: {model_name(model)}'s forward changes its LM head's output (a logit scale, softcapping or "
            f"a vocabulary cut), which log-probs computed from the head's input would leave out: set {FIELD}: false "
            "for this model"
        )
    return logits
