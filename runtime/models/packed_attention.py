"""Attention over packed rows on a GPU (training.paddingFree): a kernel that reads where each row starts.

A packed micro-batch is one row of every sequence's real tokens, its position ids restarting at 0 for each
sequence (engines/packing.py). Under transformers' default attention (SDPA), the model turns those restarts
into a dense (T, T) boolean mask, block-diagonal and causal, and SDPA reads all of it: #38 measured a packed
update on an H200 as fast as the padded one (1.007x), where packing pays 1.42-1.62x in plain PyTorch with a
kernel that skips what the mask leaves out. So on a GPU a trainer that packs loads its model with such a
kernel (`attention_implementation`):

- flash-attention's variable-length kernels, where the `flash_attn` package is installed: transformers'
  `flash_attention_2` reads the same restarts as sequence boundaries (verl's use_remove_padding path);
- otherwise FlexAttention (`flex_packed_attention`, registered with transformers as FLEX): a block mask built
  once per forward from the position ids, so whole blocks of other sequences are never computed.

On the CPU the trainer keeps SDPA: FlexAttention has no backward there. The CPU tests hold FlexAttention's
forward against the padded one; its speed, and its backward, are measured on a GPU (bench/gpu/run.sh).
"""

from typing import Any

import torch
from torch import Tensor

#: The name the FlexAttention function is registered under with transformers' AttentionInterface.
FLEX = "kuberl_packed_flex"

#: FlexAttention by device type: compiled for "cuda" (see `_flex_attention`)
_flex_by_device: dict[str, Any] = {}
#: The block mask of the forward under way, and the position ids it was made from: every layer gets the same
#: tensor, so the mask is built once per forward.
_last_mask: tuple[Tensor, int | None, Any] | None = None


#: The smallest head dimension FlexAttention's GPU kernel takes (Triton's tl.dot: inductor raises NYI below it).
FLEX_MIN_HEAD_DIM = 16


def attention_implementation(
    device_type: str, padding_free: bool, flash_installed: bool | None = None, head_dim: int | None = None
) -> str | None:
    """The `attn_implementation` a trainer's model loads with, or None for transformers' default (SDPA).
    `head_dim` is the model's (`head_dim_of`): below FLEX_MIN_HEAD_DIM FlexAttention cannot run on a GPU, and
    such a model keeps SDPA over the dense mask (right, only not faster).

    >>> attention_implementation("cuda", True, flash_installed=True)
    'flash_attention_2'
    >>> attention_implementation("cuda", True, flash_installed=False, head_dim=64)
    'kuberl_packed_flex'
    >>> attention_implementation("cuda", True, flash_installed=False, head_dim=8) is None
    True
    >>> attention_implementation("cuda", False) is None, attention_implementation("cpu", True) is None
    (True, True)
    """
    if device_type != "cuda" or not padding_free:
        return None
    if flash_installed is None:
        from transformers.utils.import_utils import is_flash_attn_2_available

        flash_installed = is_flash_attn_2_available()  # flash-attn >= 2.3.3 beside CUDA, as transformers loads it
    if flash_installed:
        return "flash_attention_2"
    if head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
        return None
    register_flex()
    return FLEX


def head_dim_of(config: Any) -> int:
    """The attention head dimension of a transformers model config (its text part, for a multimodal one).

    >>> from transformers import Qwen2Config
    >>> head_dim_of(Qwen2Config(hidden_size=64, num_attention_heads=4))
    16
    """
    text = config.get_text_config()
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def register_flex() -> None:
    """Makes FLEX a name transformers' models load with. No mask function is registered with it, so transformers
    builds no mask for it (masking_utils: a custom attention "without equivalent mask creation")."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLEX, flex_packed_attention)


def document_ids(position_ids: Tensor) -> Tensor:
    """(T,) which packed sequence each position of a (1, T) row belongs to: a new one wherever the position id
    does not follow the one before (as transformers' find_packed_sequence_indices reads packed rows).

    >>> document_ids(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist()
    [0, 0, 0, 1, 1, 2]
    """
    positions = position_ids[0]  # (T,)
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    return starts.long().cumsum(0) - 1


def packed_block_mask(position_ids: Tensor, sliding_window: int | None = None) -> Any:
    """FlexAttention's block mask for a packed (1, T) row: causal within each sequence, nothing across them (and
    within `sliding_window` positions, for models that attend to a window)."""
    from torch.nn.attention.flex_attention import create_block_mask

    documents = document_ids(position_ids)  # (T,)

    def same_sequence_causal(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        keep = (documents[query] == documents[key]) & (query >= key)
        if sliding_window is not None:
            keep = keep & (query - key < sliding_window)
        return keep

    length, device = documents.shape[0], position_ids.device
    # compiled on a GPU, as transformers builds its block masks (uncompiled, the whole (T, T) mask is evaluated)
    compile_it = device.type == "cuda"
    return create_block_mask(same_sequence_causal, None, None, length, length, device=device, _compile=compile_it)


def flex_packed_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention interface over a packed row: query (1, H, T, D), key and value (1, H_kv, T, D)
    in, (1, T, H, D) out. Only packed forwards come here (the trainer packs every pass with paddingFree)."""
    global _last_mask
    if query.shape[0] != 1 or position_ids is None:
        raise ValueError(
            f"{FLEX} attends one packed row with its position ids (training.paddingFree), "
            f"not a batch of {query.shape[0]} padded rows"
        )
    if dropout or softcap:
        raise ValueError(f"{FLEX} has no attention dropout or logit soft-capping: this model needs another attention")
    if _last_mask is None or _last_mask[0] is not position_ids or _last_mask[1] != sliding_window:
        _last_mask = (position_ids, sliding_window, packed_block_mask(position_ids, sliding_window))
    # under autocast the rotary embedding leaves query and key in float32 beside a bfloat16 value: all three go to
    # the autocast dtype, as SDPA's autocast rule casts them, so the kernel computes as the padded forward does
    device = query.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else value.dtype
    query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    output = _flex_attention(device)(
        query, key, value, block_mask=_last_mask[2], scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return output.transpose(1, 2).contiguous(), None  # (1, T, H, D)


def _flex_attention(device_type: str) -> Any:
    """FlexAttention, compiled on a GPU: uncompiled, it materialises every score. On the CPU (forward only: the
    tests) its reference implementation runs, because this machine's torch 2.13 CPU build generates C++ for the
    compiled one that does not build (`at::vec::transpose_block` missing) or does not lower, by shape."""
    if device_type not in _flex_by_device:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_by_device[device_type] = torch.compile(flex_attention) if device_type == "cuda" else flex_attention
    return _flex_by_device[device_type]
