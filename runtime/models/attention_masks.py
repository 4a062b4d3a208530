"""The attention mask a trainer's forward hands its model, built on the trainer's device from what it already has.

Given a 2D padding mask (padded rows) or restarting position ids (packed rows, training.paddingFree),
transformers builds the 4D mask SDPA reads, but first asks on the host whether it needs one at all:
`padding_mask.all()` for padded rows, `(packed_sequence_mask[:, -1] == 0).all()` for packed ones (masking_utils).
On a GPU each such read waits for the device to finish the work queued before it, once per forward pass: #38's
sync test counted 18 waits in an update of 4 passes per mini-batch against 7 in one of 1, on an H200. On the
meta device (the CPU tests' stand-in for a GPU) the same read raises.

So a trainer whose model attends through SDPA with full causal attention in every layer builds that mask itself,
the one transformers would build: a key is seen by a query when it is not after it and is a real token of the
same row (padded) or of the same sequence (packed). transformers uses a 4D mask as it is. Other models (a sliding
window, layers of another kind, eager or flash attention, FlexAttention) keep transformers' own masks.

The one difference: a pass without any padding, where transformers would skip the mask for SDPA's `is_causal`
(flash) path, gets the full mask too. Rollout batches are left- and right-padded, so such passes are rare.
"""

from typing import Any

import torch
from torch import Tensor

from kuberl.runtime.models.packed_attention import document_ids


def builds_own_mask(config: Any) -> bool:
    """Whether the trainer hands a model of `config` its 4D mask: the model attends through SDPA, and every layer
    attends to its whole causal past (no sliding window, no layer kind that transformers masks another way).

    >>> from transformers import Qwen2Config
    >>> full = Qwen2Config(num_hidden_layers=2)
    >>> full._attn_implementation = "sdpa"
    >>> builds_own_mask(full)
    True
    >>> windowed = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    >>> windowed._attn_implementation = "sdpa"
    >>> builds_own_mask(windowed)
    False
    """
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return not (getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True))


def padded_mask(attention_mask: Tensor) -> Tensor:
    """(m, 1, L, L) for padded rows' (m, L) padding mask: query i sees key j <= i when j is a real token.

    >>> padded_mask(torch.tensor([[0, 1, 1]]))[0, 0].int().tolist()
    [[0, 0, 0], [0, 1, 0], [0, 1, 1]]
    """
    length = attention_mask.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()  # (L, L)
    return causal[None, None] & attention_mask.bool()[:, None, None, :]  # (m, 1, L, L)


def packed_mask(position_ids: Tensor) -> Tensor:
    """(1, 1, T, T) for a packed (1, T) row: query i sees key j <= i of the same sequence.

    >>> packed_mask(torch.tensor([[0, 1, 0]]))[0, 0].int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    documents = document_ids(position_ids)  # (T,)
    length = documents.shape[0]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()  # (T, T)
    return (causal & (documents[:, None] == documents[None, :]))[None, None]  # (1, 1, T, T)
