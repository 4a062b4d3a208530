"""What a trainer's forward pass reads, and the one place it crosses from the host to the trainer's device.

Batches live on the host (`RolloutBatch`): the controller builds them, Ray ships them, the workers shard
them. A rank cuts its rows into micro-batches on the host (`micro_batches.py`), packs them on the host when
it trains padding-free (`packing.py`), and moves each pass's tensors to its device here, and nowhere else:

- `ForwardInput.to(device, pack=...)`: what a forward pass reads (ids, masks, and the packed layout);
- `MicroBatch`: one pass of an update, the forward input and everything the losses read beside the
  log-probs (old and reference log-probs, advantages, the tokens that train, the critic's targets).

Every loss checks that its inputs share one device (`algorithms/devices.py`) and names the one that does
not, so a tensor that skipped this move fails where it is read. The moves are asynchronous
(`non_blocking`): a host-to-device copy never waits for the GPU, and nothing here reads a value back.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.packing import pack_rows, response_layout


@dataclass(frozen=True)
class PackedInput:
    """A padding-free pass (training.paddingFree): the rows' real tokens as one row, laid out on the host."""

    input_ids: Tensor  # (1, T) the real tokens of every row, row after row
    position_ids: Tensor  # (1, T) restarting at 0 for each row
    sources: Tensor  # (K,) packed positions that predict a response token
    targets: Tensor  # (K,) where each goes in the rows' flattened (m * R) response layout


@dataclass(frozen=True)
class ForwardInput:
    input_ids: Tensor  # (n, P+R) left-padded prompt, right-padded response
    attention_mask: Tensor  # (n, P+R)
    response_ids: Tensor  # (n, R)
    prompt_width: int  # P
    packed: PackedInput | None = None  # set by `to(..., pack=True)`
    #: no row has padding, as read on the host by `to` (an attention without a mask: models/attention_masks.py)
    unpadded: bool = False

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def rows(self, rows: slice) -> "ForwardInput":
        """The rows `rows` (on the host, before packing)."""
        assert self.packed is None, "cut the rows before packing them"
        return replace(
            self,
            input_ids=self.input_ids[rows],
            attention_mask=self.attention_mask[rows],
            response_ids=self.response_ids[rows],
        )

    def to(self, device: torch.device, *, pack: bool) -> "ForwardInput":
        """These rows on `device`; with `pack`, also packed into one row (computed here, on the host).

        >>> rows = ForwardInput(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3), torch.ones(2, 1), 2)
        >>> left_padded = replace(rows, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]))
        >>> rows.to(torch.device("cpu"), pack=False).unpadded, left_padded.to(torch.device("cpu"), pack=False).unpadded
        (True, False)
        """
        packed = None
        if pack:
            rows = pack_rows(self.input_ids, self.attention_mask)
            layout = response_layout(rows.index, self.prompt_width)
            packed = PackedInput(
                input_ids=to_device(rows.input_ids, device),
                position_ids=to_device(rows.position_ids, device),
                sources=to_device(layout.sources, device),
                targets=to_device(layout.targets, device),
            )
        return ForwardInput(
            input_ids=to_device(self.input_ids, device),
            attention_mask=to_device(self.attention_mask, device),
            response_ids=to_device(self.response_ids, device),
            prompt_width=self.prompt_width,
            packed=packed,
            # read where the mask is on the host; one already on a GPU is not read (that would wait for the GPU)
            unpadded=self.attention_mask.device.type == "cpu" and bool(self.attention_mask.all()),
        )


def forward_input(batch: RolloutBatch) -> ForwardInput:
    """The forward input of every row of `batch`, on the host."""
    return ForwardInput(batch.input_ids, batch.attention_mask, batch.response_ids, batch.prompt_ids.shape[1])


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """A host tensor on `device`, copied without waiting for the device (a no-op when it is there already)."""
    return tensor.to(device, non_blocking=True)


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass of an update: m rows, everything on the trainer's device."""

    forward: ForwardInput  # the rows' ids and masks (packed when the trainer trains padding-free)
    mask: Tensor  # (m, R) the tokens that train (actor) or regress (critic)
    response_mask: Tensor  # (m, R) every response token the model wrote
    old_logprobs: Tensor | None = None  # (m, R) log pi_old
    advantages: Tensor | None = None  # (m, R)
    ref_logprobs: Tensor | None = None  # (m, R) log pi_ref
    engine_logprobs: Tensor | None = None  # (m, R) log pi_engine
    is_weights: Tensor | None = None  # (m, R) rollout-correction weights
    values: Tensor | None = None  # (m, R) the critic's values when the batch was made
    returns: Tensor | None = None  # (m, R) the critic's targets


def micro_batches_on(
    device: torch.device, batch: RolloutBatch, passes: Sequence[slice], mask: Tensor, *, pack: bool
) -> Iterator[MicroBatch]:
    """Each pass's rows of `batch` as a MicroBatch on `device`; `mask` (n, R) marks the tokens that train.

    The update's one crossing to the device: every tensor a pass reads is in the MicroBatch it yields.
    """
    forward = forward_input(batch)

    def take(tensor: Tensor | None, rows: slice) -> Tensor | None:
        return None if tensor is None else to_device(tensor[rows], device)

    for rows in passes:
        yield MicroBatch(
            forward=forward.rows(rows).to(device, pack=pack),
            mask=to_device(mask[rows], device),
            response_mask=to_device(batch.response_mask[rows], device),
            old_logprobs=take(batch.old_logprobs, rows),
            advantages=take(batch.advantages, rows),
            ref_logprobs=take(batch.ref_logprobs, rows),
            engine_logprobs=take(batch.engine_logprobs, rows),
            is_weights=take(batch.is_weights, rows),
            values=take(batch.values, rows),
            returns=take(batch.returns, rows),
        )
