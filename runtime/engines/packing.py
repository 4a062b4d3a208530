"""Padding-free (packed) forward passes (training.paddingFree; verl's use_remove_padding).

A micro-batch of m rows, each a left-padded prompt and a right-padded response (m, P+R), becomes one
row of only its real tokens (1, T) whose position ids restart at 0 for each row: the positions the
padded forward gives them (it counts real tokens only). Called with those position ids and no
attention mask, transformers (masking_utils.find_packed_sequence_indices) reads each restart as the
start of a new sequence and attends causally within each row only, on its SDPA and eager paths alike;
its flash-attention path takes the same layout as variable-length sequences, and on a GPU kuberl's FlexAttention
reads it into a block mask (models/packed_attention.py, the kernel a packing trainer gets there). Every token sees
exactly what it sees in the padded forward, and the padding is never computed: on a batch of mixed
lengths most of the padded tensor is padding (bench/padding_free.py).

`index` maps each padded position to its packed one, so the trainer reads the model's outputs at the positions
that predict response tokens and returns log-probs and values in the same (m, R) shapes as the padded forward
(zero at the padding). `response_layout` turns it into two flat index lists, computed on the host with the
packing itself, so that on a GPU reading the outputs back is a gather, never a boolean mask (whose size the
host would have to wait for).
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedRows:
    input_ids: Tensor  # (1, T) the real tokens of every row, row after row
    position_ids: Tensor  # (1, T) 0, 1, ... within each row
    index: Tensor  # (m, L) where each padded position's token sits in the packed row; -1 at padding


def pack_rows(input_ids: Tensor, attention_mask: Tensor) -> PackedRows:
    """The real tokens (attention_mask 1) of `input_ids` (m, L) as one packed row.

    >>> packed = pack_rows(torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))
    >>> packed.input_ids.tolist(), packed.position_ids.tolist(), packed.index.tolist()
    ([[5, 6, 7, 8, 9]], [[0, 1, 0, 1, 2]], [[-1, 0, 1], [2, 3, 4]])
    """
    real = attention_mask.bool()  # (m, L)
    positions = attention_mask.long().cumsum(-1) - 1  # (m, L) as position_ids() gives the padded forward
    index = torch.full(real.shape, -1, dtype=torch.long, device=real.device)  # (m, L)
    index[real] = torch.arange(int(real.sum()), device=real.device)
    return PackedRows(input_ids=input_ids[real][None], position_ids=positions[real][None], index=index)


@dataclass(frozen=True)
class ResponseLayout:
    """Where a packed forward's outputs for the response tokens are, and where they go.

    Position t of a row's response is predicted by the token before it; that position is packed when it holds
    a real token. `sources[k]` is such a position in the packed row, `targets[k]` its place in the rows'
    flattened (m * R) response layout.
    """

    sources: Tensor  # (K,) positions in the packed row
    targets: Tensor  # (K,) positions in the flattened (m * R) response layout


def response_layout(index: Tensor, prompt_width: int) -> ResponseLayout:
    """The packed positions that predict response tokens (see ResponseLayout), from `PackedRows.index`.

    >>> layout = response_layout(torch.tensor([[-1, 0, 1, -1], [2, 3, 4, 5]]), prompt_width=2)
    >>> layout.sources.tolist(), layout.targets.tolist()
    ([0, 1, 3, 4], [0, 1, 2, 3])
    """
    predicting = index[:, prompt_width - 1 : -1]  # (m, R) position t predicts response token t
    present = predicting >= 0  # (m, R)
    return ResponseLayout(sources=predicting[present], targets=present.flatten().nonzero().flatten())
