"""Per-token KL estimators between the actor and the reference model.

From Schulman, "Approximating KL divergence" (2020), with r = pi_ref / pi = exp(ref - logprobs)
and samples drawn from the actor:
- k1 = -log r = logprobs - ref: unbiased, high variance, can be negative (the usual in-reward penalty).
- k2 = 0.5 * (log r)^2: biased, low variance, >= 0.
- k3 = r - 1 - log r: unbiased, low variance, >= 0 (GRPO's in-loss KL; verl's `low_var_kl`).

As verl's `low_var_kl` does, k3 clamps the log-ratio to [-20, 20] and the result to [-10, 10], so a
token the reference finds nearly impossible cannot blow the loss up.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from kuberl.runtime.algorithms.devices import check_same_device
from kuberl.runtime.algorithms.registry import KL_ESTIMATORS

KLFn = Callable[[Tensor, Tensor], Tensor]  # (logprobs (N, R), ref_logprobs (N, R)) -> kl (N, R)

K3_LOG_RATIO_BOUND = 20.0
K3_VALUE_BOUND = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs  # (N, R)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2  # (N, R)


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_ratio = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)  # (N, R)
    kl = torch.exp(log_ratio) - log_ratio - 1  # (N, R)
    return kl.clamp(-K3_VALUE_BOUND, K3_VALUE_BOUND)  # (N, R)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """The per-token KL of the named estimator (`spec.algorithm.kl.estimator`); padding is the caller's to mask."""
    check_same_device("kl_penalty", logprobs=logprobs, ref_logprobs=ref_logprobs)
    return KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)  # (N, R)
