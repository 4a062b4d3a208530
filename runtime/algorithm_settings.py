"""spec.algorithm (and its neighbours) as the plain values the algorithm library takes.

The library (`runtime/algorithms/`) is pure torch and knows nothing of the RLJob; this is the one
place that reads the spec's knobs into its configs.
"""

from dataclasses import dataclass

from kuberl.api import AlgorithmSpec, RLJobSpec
from kuberl.runtime.algorithms.correction import CorrectionConfig
from kuberl.runtime.algorithms.losses import PolicyLossConfig
from kuberl.runtime.engines.micro_batches import MicroBatching


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


@dataclass(frozen=True)
class MicroBatchSizes:
    """Sequences per pass on one rank, per role and pass (verl's *_micro_batch_size_per_gpu)."""

    actor_update: int  # models.actor.microBatchSize
    actor_forward: int  # models.actor.forwardMicroBatchSize: the old log-probs
    critic_update: int  # models.critic.microBatchSize
    critic_forward: int  # models.critic.forwardMicroBatchSize: the values before the update
    reference_forward: int  # models.reference.microBatchSize
    #: Token budgets (models.<role>.maxTokensPerMicroBatch, forwardMaxTokensPerMicroBatch; verl's use_dynamic_bsz):
    #: where set, micro-batches are cut by tokens and the row count beside it is not used.
    actor_update_tokens: int | None = None
    actor_forward_tokens: int | None = None
    critic_update_tokens: int | None = None
    critic_forward_tokens: int | None = None
    reference_forward_tokens: int | None = None

    def forward(self, role: str) -> MicroBatching:
        """How `role`'s forward-only pass (actor, critic or reference) is cut."""
        return {
            "actor": MicroBatching(self.actor_forward, self.actor_forward_tokens),
            "critic": MicroBatching(self.critic_forward, self.critic_forward_tokens),
            "reference": MicroBatching(self.reference_forward, self.reference_forward_tokens),
        }[role]


def micro_batch_sizes(spec: RLJobSpec) -> MicroBatchSizes:
    """Each role's own micro-batch sizes, training.microBatchSize where a role sets none."""
    default = spec.training.micro_batch_size
    actor, critic, reference = spec.models.actor, spec.models.critic, spec.models.reference

    def own(size: int | None) -> int:
        return size if size is not None else default

    return MicroBatchSizes(
        actor_update=own(actor.micro_batch_size),
        actor_forward=own(actor.forward_micro_batch_size),
        critic_update=own(critic.micro_batch_size if critic is not None else None),
        critic_forward=own(critic.forward_micro_batch_size if critic is not None else None),
        reference_forward=own(reference.micro_batch_size if reference is not None else None),
        actor_update_tokens=actor.max_tokens_per_micro_batch,
        actor_forward_tokens=actor.forward_max_tokens_per_micro_batch,
        critic_update_tokens=critic.max_tokens_per_micro_batch if critic is not None else None,
        critic_forward_tokens=critic.forward_max_tokens_per_micro_batch if critic is not None else None,
        reference_forward_tokens=reference.max_tokens_per_micro_batch if reference is not None else None,
    )
