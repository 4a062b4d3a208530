"""Statistics over the valid (unpadded) entries of a tensor.

Every helper selects with `torch.where` rather than multiplying by the mask, so whatever sits in
the padding (garbage, inf, NaN) never reaches the result. An empty mask gives 0, not NaN.

Departure from verl's `masked_var`: with fewer than two valid entries verl raises; here the
unbiased variance falls back to the biased one (0 for a single entry), so whitening a batch with
one valid token yields 0 instead of stopping the run.
"""

import torch
from torch import Tensor

#: Added to the variance before the reciprocal square root, as verl does.
WHITEN_EPS = 1e-8


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `x` where `mask` is true, over `dim` (all elements when None)."""
    picked = torch.where(mask.bool(), x, 0.0)  # same shape as x
    return picked.sum() if dim is None else picked.sum(dim)  # () or x's shape without dim


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the entries where `mask` is true; 0 where there are none."""
    valid = mask.bool()  # same shape as x
    count = valid.sum() if dim is None else valid.sum(dim)  # () or x's shape without dim
    return masked_sum(x, valid, dim) / count.clamp(min=1)  # () or x's shape without dim


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the valid entries of `x` (all dimensions together)."""
    valid = mask.bool()  # same shape as x
    mean = masked_mean(x, valid)  # ()
    variance = masked_mean((x - mean) ** 2, valid)  # ()
    if unbiased:
        count = valid.sum().to(variance.dtype)  # ()
        bessel = torch.where(count > 1, count / (count - 1).clamp(min=1), 1.0)  # ()
        variance = variance * bessel  # ()
    return variance


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / std over the valid entries; padding comes back as exactly 0.

    shift_mean=False scales to unit variance but keeps the mean (verl's meaning of the flag).
    """
    valid = mask.bool()  # same shape as x
    mean = masked_mean(x, valid)  # ()
    variance = masked_var(x, valid)  # ()
    whitened = (x - mean) * torch.rsqrt(variance + WHITEN_EPS)  # same shape as x
    if not shift_mean:
        whitened = whitened + mean  # same shape as x
    return torch.where(valid, whitened, 0.0)  # same shape as x
