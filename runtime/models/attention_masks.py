"""The attention mask a trainer's forward hands its model, built on the trainer's device from what it already has.

Given a 2D padding mask (padded rows) or restarting position ids (packed rows, training.paddingFree),
transformers builds the 4D mask SDPA reads, but first asks on the host whether it needs one at all:
`padding_mask.all()` for padded rows, `(packed_sequence_mask[:, -1] == 0).all()` for packed ones (masking_utils).
On a GPU each such read waits for the device to finish the work queued before it, once per forward pass: #38's
sync test counted 18 waits in an update of 4 passes per mini-batch against 7 in one of 1, on an H200. On the
meta device (the CPU tests' stand-in for a GPU) the same read raises.

So a trainer whose model attends through SDPA with full causal attention in every layer builds that mask itself,
the one transformers would build: a key is seen by a query when it is not after it and is a real token of the
same row (padded) or of the same sequence (packed). Other models (a sliding window, layers of another kind, eager
or flash attention, FlexAttention) keep transformers' own masks.

A pass without any padding needs no mask at all: SDPA's `is_causal` kernel (flash, on a GPU) computes only the
lower triangle, where a mask of the same meaning makes SDPA pick a kernel that computes every score. The trainer
knows such a pass on the host (`ForwardInput.unpadded`), but transformers, handed no mask, would ask again on the
host: it reads the position ids for packed sequences (`find_packed_sequence_indices`). So for such a pass the
trainer's model attends under OWN_SDPA (`own_sdpa`), transformers' own SDPA function under a name of its own with
no mask function: for such a name transformers builds no mask and reads nothing.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from kuberl.runtime.models.lora import transformers_model
from kuberl.runtime.models.packed_attention import document_ids

#: transformers' SDPA attention, registered under this name with no mask function (see the module's docstring)
OWN_SDPA = "kuberl_sdpa"


def attends_without_a_mask(model: Any) -> bool:
    """Whether a forward of `model` can attend under OWN_SDPA (`own_sdpa`): it builds its masks with transformers'
    functions (its attention is looked up by name at every call), and the trainer builds its masks
    (`builds_own_mask`). Registers OWN_SDPA with transformers."""
    base = transformers_model(model)
    if not (hasattr(base, "config") and builds_own_mask(base.config) and base._can_set_attn_implementation()):
        return False
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(OWN_SDPA, sdpa_attention_forward)
    return True


@contextlib.contextmanager
def own_sdpa(model: Any) -> Iterator[None]:
    """`model` attends under OWN_SDPA for a forward handed no mask, for rows without padding: transformers builds
    no mask and reads nothing, and SDPA runs its causal kernel. Only inside the block: anyone else calling the
    model with a 2D mask must get transformers' masks, not none. (A recomputation of a layer under gradient
    checkpointing, after the block, runs the same SDPA function without a mask: the same attention.)"""
    config = model.config
    attention = config._attn_implementation
    config._attn_implementation = OWN_SDPA  # sub-configs too (transformers' setter)
    try:
        yield
    finally:
        config._attn_implementation = attention


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
