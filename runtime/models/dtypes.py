"""The torch dtype of every parameter dtype the RLJob schema accepts (api/enums.py DType), defined once."""

import torch

from kuberl.api import DType, RLJobSpec

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


def rollout_dtype(spec: RLJobSpec) -> str:
    """The dtype the rollout engine runs in: spec.rollout.dtype, else the actor's (verl's default is bfloat16)."""
    return (spec.rollout.dtype or spec.models.actor.dtype).value


def reference_dtype(spec: RLJobSpec) -> str:
    """The reference model's dtype: spec.models.reference.dtype, else the actor's."""
    reference = spec.models.reference
    return ((reference.dtype if reference is not None else None) or spec.models.actor.dtype).value
