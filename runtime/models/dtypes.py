"""The torch dtype of every parameter dtype the RLJob schema accepts (api/enums.py DType), defined once."""

import torch

from kuberl.api import DType

TORCH_DTYPES: dict[str, torch.dtype] = {
    DType.FLOAT32.value: torch.float32,
    DType.BFLOAT16.value: torch.bfloat16,
    DType.FLOAT16.value: torch.float16,
}


def torch_dtype(name: str, what: str = "dtype") -> torch.dtype:
    """`bfloat16` -> torch.bfloat16; an unknown name is refused, naming `what` and the choices."""
    if name not in TORCH_DTYPES:
        raise ValueError(f"{what} {name!r}; use one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]
