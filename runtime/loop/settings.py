"""What a training step does, resolved from the spec once, when the run is planned: `StepSettings`.

    settings = step_settings(spec, mini_batches=..., actor_world_size=...)   # make_plan does this
    settings.group_size, settings.sampling, settings.kl, settings.overlong, settings.micro, settings.update

The stages (the controller, the rollout stages, dynamic sampling) take these fields, never the raw spec, and
none fills in a default again: the API filled every one (api/algorithm.py's presets), and this is the one place
that reads the spec's knobs into the plain values the algorithm library takes (`runtime/algorithms/` is pure
torch and knows nothing of the RLJob).
"""

from dataclasses import dataclass, replace

from kuberl.api import AlgorithmSpec, KLPlacement, RLJobSpec
from kuberl.runtime.algorithms.advantages import estimator_reads
from kuberl.runtime.algorithms.correction import CorrectionConfig
from kuberl.runtime.algorithms.losses import PolicyLossConfig
from kuberl.runtime.algorithms.registry import ADVANTAGE_ESTIMATORS
from kuberl.runtime.engines.micro_batches import MicroBatching
from kuberl.runtime.engines.updates import UpdateConfig
from kuberl.runtime.rollout.base import Sampling


@dataclass(frozen=True)
class KLSettings:
    """spec.algorithm.kl: a coefficient of 0 is no KL (and no reference pass)."""

    coef: float
    placement: KLPlacement | None  # reward: subtracted from the token rewards; loss: added to the policy loss
    estimator: str  # a KL_ESTIMATORS name (k1, k2, k3)

    @property
    def in_reward(self) -> bool:
        return self.coef > 0 and self.placement == KLPlacement.REWARD

    @property
    def in_loss_coef(self) -> float:
        return self.coef if self.placement == KLPlacement.LOSS else 0.0


@dataclass(frozen=True)
class OverlongShaping:
    """spec.reward.overlongPenalty when enabled: responses within `buffer_length` of the budget lose up to
    `penalty_factor` (DAPO's soft overlong punishment, algorithms/shaping.py)."""

    buffer_length: int
    penalty_factor: float


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


@dataclass(frozen=True)
class StepSettings:
    """Every setting a training step reads, resolved from the spec once."""

    group_size: int  # responses per prompt (spec.algorithm.groupSize)
    max_response_tokens: int  # the most tokens after a prompt: a response's, or an episode's (spec.max_response_tokens)
    sampling: Sampling
    kl: KLSettings
    overlong: OverlongShaping | None  # None: no overlong penalty
    micro: MicroBatchSizes
    correction: CorrectionConfig | None  # spec.algorithm.rolloutCorrection
    use_engine_logprobs: bool  # spec.rollout.useEngineLogprobs: the engine's log-probs are the behaviour policy's
    update: UpdateConfig  # the actor's update; the critic's differs in its world size and micro-batches


def step_settings(spec: RLJobSpec, *, mini_batches: int, actor_world_size: int) -> StepSettings:
    """The settings of every step of `spec`'s run, with `mini_batches` per update over `actor_world_size` ranks."""
    algorithm = spec.algorithm
    if algorithm.group_size is None or algorithm.advantage_estimator is None or algorithm.policy_loss is None:
        raise ValueError("spec.algorithm was not filled in from its preset: parse the manifest with parse_rljob")
    kl = KLSettings(algorithm.kl.coef or 0.0, algorithm.kl.placement, str(algorithm.kl.estimator))
    correction = correction_config(spec)
    use_engine_logprobs = spec.rollout.use_engine_logprobs
    micro = micro_batch_sizes(spec)
    on_policy = behaviour_is_current_policy(spec, mini_batches, kl, correction)
    update = UpdateConfig(
        ppo_epochs=algorithm.ppo_epochs,
        mini_batches=mini_batches,
        micro_batch_size=micro.actor_update,
        max_tokens_per_micro_batch=micro.actor_update_tokens,
        world_size=actor_world_size,
        temperature=spec.rollout.temperature,
        aggregation=str(algorithm.loss_aggregation),
        max_response_length=spec.max_response_tokens,
        policy_loss=str(algorithm.policy_loss),
        loss_config=policy_loss_config(algorithm),
        bypass_correction=correction if use_engine_logprobs else None,
        seed=spec.training.seed,
        kl_in_loss_coef=kl.in_loss_coef,
        kl_estimator=kl.estimator,
        entropy_coef=algorithm.entropy_coef,
        value_clip=algorithm.value_clip,
        on_policy=on_policy,
    )
    if on_policy and correction is not None:
        update = replace(update, on_policy_correction=correction)
    rollout = spec.rollout
    return StepSettings(
        group_size=algorithm.group_size,
        max_response_tokens=spec.max_response_tokens,
        sampling=Sampling(
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            max_new_tokens=rollout.max_new_tokens,
            stop=tuple(rollout.stop),
            seed=spec.training.seed,
        ),
        kl=kl,
        overlong=overlong_shaping(spec),
        micro=micro,
        correction=correction,
        use_engine_logprobs=use_engine_logprobs,
        update=update,
    )


def overlong_shaping(spec: RLJobSpec) -> OverlongShaping | None:
    penalty = spec.reward.overlong_penalty
    if penalty is None or not penalty.enabled:
        return None
    assert penalty.buffer_length is not None  # the API fills it from the response budget
    return OverlongShaping(penalty.buffer_length, penalty.penalty_factor)


def behaviour_is_current_policy(
    spec: RLJobSpec, mini_batches: int, kl: KLSettings, correction: CorrectionConfig | None
) -> bool:
    """True when the old log-probs can come from the update's own forward pass instead of a pass of their own.

    That holds with one PPO epoch over one mini-batch (the policy has not moved when each token's
    log-prob is first computed), when the engine's log-probs are not the behaviour policy, and when
    no stage before the update reads them (a KL penalty in the reward does, a token-baseline estimator does, and
    so does the rollout
    correction's rejection, which must drop tokens before the update counts its denominators). The
    correction's truncated weight pi_old / pi_engine is then computed in the update from the same
    forward pass (UpdateConfig.on_policy_correction): an asynchronous run's decoupled PPO costs no extra pass.
    """
    estimator = ADVANTAGE_ESTIMATORS.get(str(spec.algorithm.advantage_estimator))
    return (
        spec.algorithm.ppo_epochs == 1
        and mini_batches == 1
        and not spec.rollout.use_engine_logprobs
        and not kl.in_reward
        and "old_logprobs" not in estimator_reads(estimator)  # the token baselines read pi_old before the update
        and (correction is None or correction.rejection is None)
    )
