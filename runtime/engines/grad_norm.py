"""The gradient norm an optimiser step clips by and reports (`actor/grad_norm`, `critic/grad_norm`).

On a GPU, torch's own: `get_total_norm` over the gradients, reduced over the ranks as DTensors.

In host memory it is computed here. That covers an offloaded model's gradients (models.<role>.offload) and a CPU
trainer's. torch's CPU kernel for a float32 2-norm keeps one float32 running sum per vector lane, and for a large
tensor that sum stops growing (pytorch/pytorch#169237). On this machine it was 1.5% low for a tensor of 136M
elements, the size of a 0.5B Qwen's embedding gradient, and 0.04% low at 10M. That is the number the step clips
by. So each piece of 2^18 elements is summed on its own, as a BLAS dot product in float32, and the pieces' sums
are added in float64. At 136M elements that lands within 3e-8 of the float64 norm, in half the time of torch's
norm (`bench/grad_norm.py`).
"""

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

#: elements summed in float32 before the float64 total: short enough that float32 loses nothing that matters
#: (3e-8 of the norm at 136M elements), long enough that each dot product is a BLAS call, not Python overhead
PIECE = 1 << 18


def gradient_norm(grads: list[Tensor], device: torch.device, world_size: int) -> Tensor:
    """The 2-norm of all of `grads` together, over all `world_size` ranks: a float32 scalar where the gradients
    are, on `device` or in host memory (where the clip reads it).

    `grads` are one rank's gradients, plain tensors or FSDP2's DTensor shards, all on the device or all in host
    memory. Every rank calls this at the same step: with host gradients on more than one rank, the squares are
    summed over the process group (its gloo side on a GPU rank).

    >>> round(float(gradient_norm([torch.full((3,), 2.0), torch.full((2, 2), 1.0)], torch.device("cpu"), 1)), 6)
    4.0
    """
    if not host_gradients(grads):
        norm = torch.nn.utils.get_total_norm(grads)
        norm = norm.to(device)  # the reduction over ranks runs on the device its collectives use
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    squares = host_sum_of_squares(grads)  # float64, this rank's shards
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(squares)  # FSDP2 shards every parameter over the ranks: the shards' squares add up
    return squares.sqrt().float()


def needs_clipping(norm: Tensor, clip: float) -> bool:
    """Whether gradients of norm `norm` are to be scaled to `clip` (models.<role>.optim.gradClip).

    With a norm on the device, always: reading it would make the host wait for the device, and the scale is 1
    below the clip. With a norm in host memory, only above the clip: below it the scale of 1 would still rewrite
    every host gradient (0.11 s for a 0.5B model's on this machine, bench/grad_norm.py). A NaN norm is above
    nothing: its step is skipped (`FSDPTrainer.optimizer_step`).

    >>> [needs_clipping(torch.tensor(norm), 1.0) for norm in (0.5, 2.0, float("nan"))]
    [False, True, False]
    """
    return norm.device.type != "cpu" or float(norm) > clip


def host_gradients(grads: list[Tensor]) -> bool:
    """Whether every gradient is in host memory (and there is at least one)."""
    return bool(grads) and all(local(grad).device.type == "cpu" for grad in grads)


def host_sum_of_squares(tensors: list[Tensor]) -> Tensor:
    """The sum of every element's square, in float64, summed by pieces of PIECE elements.

    >>> float(host_sum_of_squares([torch.ones(PIECE + 3)])) == PIECE + 3
    True
    """
    total = torch.zeros((), dtype=torch.float64)
    for tensor in tensors:
        flat = local(tensor).detach().reshape(-1)  # (n,)
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.float()
        for piece in flat.split(PIECE):
            total += torch.dot(piece, piece)
    return total


def local(tensor: Tensor) -> Tensor:
    """A DTensor's shard on this rank; any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
