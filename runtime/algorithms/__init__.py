"""The algorithm library: advantage estimators, policy/value losses, KL estimators and loss aggregation.

Pure torch functions, looked up by name in the registries of `registry.py`. Importing this package
imports every module that registers, so the registries are complete after
`import kuberl.runtime.algorithms`.
"""

from kuberl.runtime.algorithms import (
    advantages,
    clipped_surrogates,
    correction,
    covariance_losses,
    group_baselines,
    kl,
    losses,
    masked,
    registry,
    reinforce_losses,
    returns,
    token_baselines,
)
from kuberl.runtime.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "Registry",
    "UnknownNameError",
    "advantages",
    "clipped_surrogates",
    "correction",
    "covariance_losses",
    "group_baselines",
    "kl",
    "losses",
    "masked",
    "registry",
    "reinforce_losses",
    "returns",
    "token_baselines",
]
