"""The one rule every loss, KL and correction keeps about devices: its inputs share one.

Batches live on the host and a micro-batch moves to the trainer's device in one place
(`engines/inputs.py`). A tensor that missed that move shows up here, at the first function that reads
it, with its name, instead of as torch's "Expected all tensors to be on the same device" from deep
inside an expression that does not say which input was elsewhere. On a CPU-only machine every real
tensor is on the CPU, so the tests drive these checks with tensors on another device (meta, or
FakeTensorMode's fake "cuda").
"""

from torch import Tensor


class DeviceMismatchError(ValueError):
    """An input of a loss, KL or correction is not on the device of the others."""


def check_same_device(where: str, **inputs: Tensor | None) -> None:
    """Raise DeviceMismatchError naming the first input not on the device of the first one (None is skipped).

    >>> import torch
    >>> try:
    ...     check_same_device("kl_penalty", logprobs=torch.zeros(2), ref_logprobs=torch.zeros(2, device="meta"))
    ... except DeviceMismatchError as error:
    ...     print(str(error).split(";")[0])
    kl_penalty: ref_logprobs is on meta, logprobs on cpu
    """
    first: tuple[str, Tensor] | None = None
    for name, tensor in inputs.items():
        if tensor is None:
            continue
        if first is None:
            first = (name, tensor)
        elif tensor.device != first[1].device:
            raise DeviceMismatchError(
                f"{where}: {name} is on {tensor.device}, {first[0]} on {first[1].device}; a pass's tensors "
                "move to the trainer's device together, in one MicroBatch (engines/inputs.py)"
            )
