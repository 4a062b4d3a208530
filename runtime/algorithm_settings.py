"""spec.algorithm (and its neighbours) as the plain values the algorithm library takes.

The library (`runtime/algorithms/`) is pure torch and knows nothing of the RLJob; this is the one
place that reads the spec's knobs into its configs.
"""

from kuberl.api import AlgorithmSpec, RLJobSpec
from kuberl.runtime.algorithms.correction import CorrectionConfig
from kuberl.runtime.algorithms.losses import PolicyLossConfig


def policy_loss_config(algorithm: AlgorithmSpec) -> PolicyLossConfig:
    """The clip range, dual clip and the chosen loss's own section (clipCov, klCov, sapo)."""
    low = algorithm.clip_ratio_low if algorithm.clip_ratio_low is not None else 0.2
    knobs: dict[str, float] = {}
    if algorithm.clip_cov is not None:
        knobs.update(
            clip_cov_ratio=algorithm.clip_cov.ratio,
            clip_cov_lower=algorithm.clip_cov.lower_bound,
            clip_cov_upper=algorithm.clip_cov.upper_bound,
        )
    if algorithm.kl_cov is not None:
        knobs.update(kl_cov_ratio=algorithm.kl_cov.ratio, kl_cov_coef=algorithm.kl_cov.coef)
    if algorithm.sapo is not None:
        knobs.update(tau_positive=algorithm.sapo.tau_positive, tau_negative=algorithm.sapo.tau_negative)
    return PolicyLossConfig(
        clip_low=low,
        clip_high=algorithm.clip_ratio_high if algorithm.clip_ratio_high is not None else low,
        dual_clip_c=algorithm.dual_clip_c,
        **knobs,
    )


def correction_config(spec: RLJobSpec) -> CorrectionConfig | None:
    """spec.algorithm.rolloutCorrection, or None when there is none."""
    correction = spec.algorithm.rollout_correction
    if correction is None:
        return None
    high = correction.rejection_threshold_high
    low = correction.rejection_threshold_low if correction.rejection_threshold_low is not None else 1.0 / high
    return CorrectionConfig(
        importance_sampling=None if correction.importance_sampling is None else str(correction.importance_sampling),
        is_threshold=correction.is_threshold,
        rejection=None if correction.rejection is None else str(correction.rejection),
        rejection_low=low,
        rejection_high=high,
    )
