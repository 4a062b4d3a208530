"""`spec.algorithm`: which RL algorithm, and the knobs of its advantage estimator, loss and KL term.

`name` is a preset. Fields left unset take the preset's value from `ALGORITHM_PRESETS`, so
`name: grpo` alone is a complete GRPO configuration and any field can still be overridden.
"""

from dataclasses import dataclass

from pydantic import Field, model_validator

from kuberl.api.base import KuberlModel
from kuberl.api.correction import RolloutCorrectionSpec
from kuberl.api.enums import (
    AdvantageEstimator,
    AlgorithmName,
    KLEstimator,
    KLPlacement,
    LossAggregation,
    PolicyLoss,
)
from kuberl.api.limits import MAX_BATCH, MAX_COEFFICIENT
from kuberl.api.policy_losses import (
    LOSS_DEFAULT_AGGREGATION,
    LOSS_KNOB_MODELS,
    LOSS_KNOB_SECTIONS,
    ClipCovSpec,
    KLCovSpec,
    SAPOSpec,
)
from kuberl.api.rules import ALGORITHM_RULES, raise_rule_problems


@dataclass(frozen=True)
class AlgorithmPreset:
    estimator: AdvantageEstimator
    group_size: int
    kl_placement: KLPlacement
    kl_coef: float
    loss_aggregation: LossAggregation
    normalize_advantage_std: bool = True
    policy_loss: PolicyLoss = PolicyLoss.PPO_CLIP
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    dynamic_sampling: bool = False  # DAPO's dynamic sampling on (algorithm.dynamicSampling)
    overlong_penalty: bool = False  # DAPO's soft overlong punishment on (reward.overlongPenalty)


#: Where each preset comes from:
#: grpo — DeepSeekMath (arXiv 2402.03300): group-normalised rewards, k3 KL in the loss.
#: dr_grpo — "Understanding R1-Zero-Like Training" (arXiv 2503.20783): no std division, no length normalisation.
#: dapo — arXiv 2503.14476: clip-higher (0.28), token-level loss, no KL, dynamic sampling, overlong shaping.
#: gspo — Group Sequence Policy Optimization (arXiv 2507.18071): the length-normalised sequence ratio, clipped
#:        to [1 - 3e-4, 1 + 4e-4] as in the paper, sequence-level loss, no KL.
#: cispo — MiniMax-M1 (arXiv 2506.13585): the clipped importance weight times log pi, token-level loss, no
#:         lower bound on the weight (the paper tunes only the upper one), no KL.
#: ppo — InstructGPT-style PPO with a critic, GAE and a k1 KL penalty in the reward.
#: rloo — Ahmadian et al. (arXiv 2402.14740): leave-one-out baseline.
#: reinforce_pp — REINFORCE++ (arXiv 2501.03262): batch-normalised returns, k1 KL in the reward.
#: remax — ReMax (arXiv 2310.10505): the greedy response's reward as baseline.
ALGORITHM_PRESETS: dict[AlgorithmName, AlgorithmPreset] = {
    AlgorithmName.GRPO: AlgorithmPreset(
        AdvantageEstimator.GRPO, 8, KLPlacement.LOSS, 0.001, LossAggregation.SEQ_MEAN_TOKEN_MEAN
    ),
    AlgorithmName.DR_GRPO: AlgorithmPreset(
        AdvantageEstimator.GRPO,
        8,
        KLPlacement.LOSS,
        0.0,
        LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM,
        normalize_advantage_std=False,
    ),
    AlgorithmName.DAPO: AlgorithmPreset(
        AdvantageEstimator.GRPO,
        16,
        KLPlacement.LOSS,
        0.0,
        LossAggregation.TOKEN_MEAN,
        clip_ratio_high=0.28,
        dynamic_sampling=True,
        overlong_penalty=True,
    ),
    AlgorithmName.GSPO: AlgorithmPreset(
        AdvantageEstimator.GRPO,
        8,
        KLPlacement.LOSS,
        0.0,
        LossAggregation.SEQ_MEAN_TOKEN_MEAN,
        policy_loss=PolicyLoss.GSPO,
        clip_ratio_low=0.0003,
        clip_ratio_high=0.0004,
    ),
    AlgorithmName.CISPO: AlgorithmPreset(
        AdvantageEstimator.GRPO,
        8,
        KLPlacement.LOSS,
        0.0,
        LossAggregation.TOKEN_MEAN,
        policy_loss=PolicyLoss.CISPO,
        clip_ratio_low=1.0,
        clip_ratio_high=0.28,
    ),
    AlgorithmName.PPO: AlgorithmPreset(
        AdvantageEstimator.GAE, 1, KLPlacement.REWARD, 0.001, LossAggregation.TOKEN_MEAN
    ),
    AlgorithmName.RLOO: AlgorithmPreset(
        AdvantageEstimator.RLOO, 4, KLPlacement.REWARD, 0.001, LossAggregation.TOKEN_MEAN
    ),
    AlgorithmName.REINFORCE_PP: AlgorithmPreset(
        AdvantageEstimator.REINFORCE_PLUS_PLUS, 1, KLPlacement.REWARD, 0.001, LossAggregation.TOKEN_MEAN
    ),
    AlgorithmName.REMAX: AlgorithmPreset(
        AdvantageEstimator.REMAX, 1, KLPlacement.REWARD, 0.001, LossAggregation.TOKEN_MEAN
    ),
}


class DynamicSamplingSpec(KuberlModel):
    """DAPO's dynamic sampling (arXiv 2503.14476, section 3.2): train only on groups whose rewards differ."""

    enabled: bool = Field(
        True, description="Filter groups and generate more until the batch is full. Default: on with name dapo."
    )
    metric: str = Field(
        "score",
        min_length=1,
        pattern=r"^[A-Za-z_][A-Za-z0-9_./-]*$",
        description="What must differ within a group for it to train: score (the reward function's score), "
        "reward (the score after reward.overlongPenalty), or the name of a metric the reward function returns "
        "beside its score (e.g. acc). A group whose members all share one value is dropped.",
    )
    max_rounds_per_step: int = Field(
        8,
        ge=1,
        le=1000,
        description="Most generation rounds of data.batchSize prompts one step may take to fill its batch "
        "(verl's max_num_gen_batches). A step that hits it trains on the groups it has.",
    )
    max_capped_steps: int = Field(
        3,
        ge=1,
        le=100000,
        description="Stop the job when this many steps in a row hit maxRoundsPerStep: the data is then too easy "
        "or too hard for the model to fill a batch with groups that teach something.",
    )


class KLSpec(KuberlModel):
    """The KL term that keeps the actor near the reference model."""

    coef: float | None = Field(
        None,
        ge=0,
        le=MAX_COEFFICIENT,
        description="Weight of the KL term; 0 turns it off and no reference model is run. "
        "Default: the preset's (0.001 for grpo/ppo/rloo/reinforce_pp/remax, 0 for dr_grpo and dapo).",
    )
    estimator: KLEstimator | None = Field(
        None,
        description="KL estimator per token (Schulman, 'Approximating KL divergence'): k1 = log-ratio, "
        "k2 = half squared log-ratio, k3 = low-variance unbiased estimate. Default: k3 in the loss, k1 in the reward.",
    )
    placement: KLPlacement | None = Field(
        None,
        description="`reward` subtracts coef*KL from each token's reward (PPO, REINFORCE++); `loss` adds coef*KL "
        "to the policy loss (GRPO). Default: the preset's.",
    )


class AlgorithmSpec(KuberlModel):
    """The RL algorithm: a named preset plus any overrides."""

    name: AlgorithmName = Field(
        AlgorithmName.GRPO,
        description="Algorithm preset; it supplies the defaults of every unset field below. "
        "One of grpo, dr_grpo, dapo, gspo, cispo, ppo, rloo, reinforce_pp, remax.",
    )
    advantage_estimator: AdvantageEstimator | None = Field(
        None,
        description="How advantages are computed from rewards: gae (needs a critic), grpo, rloo, opo (OPO, "
        "arXiv 2505.23585: length-weighted group baseline), gpg (GPG, arXiv 2504.02546), grpo_passk (Pass@k "
        "training, arXiv 2503.19595: only each group's best response learns), reinforce_plus_plus, "
        "reinforce_plus_plus_baseline, remax, optimal_token_baseline and tir_optimal_token_baseline (verl's "
        "optimal token baseline: a baseline per token weighted by the old policy's path variance; the tir form "
        "aligns an episode's model tokens in order; both need the old-log-prob pass). Default: the preset's.",
    )
    normalize_advantage_std: bool | None = Field(
        None,
        description="grpo and grpo_passk estimators: divide by the group's standard deviation "
        "(false gives Dr. GRPO). Default: the preset's.",
    )
    group_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Responses sampled per prompt. Group estimators (grpo, rloo, opo, gpg, grpo_passk, "
        "reinforce_plus_plus_baseline) need at least 2. Default: 8 for grpo/dr_grpo/gspo/cispo, 16 for dapo, "
        "4 for rloo, 1 otherwise.",
    )
    policy_loss: PolicyLoss | None = Field(
        None,
        description="Policy loss: ppo_clip (PPO's clipped surrogate), gspo (sequence ratio, arXiv 2507.18071), "
        "cispo (clipped importance weight times log pi, MiniMax-M1, arXiv 2506.13585), clip_cov and kl_cov "
        "(arXiv 2505.22617), gpg (plain -A log pi, arXiv 2504.02546), geo_mean (GMPO, geometric mean of the "
        "token ratios, arXiv 2507.20673), sapo (soft gate instead of a clip, arXiv 2511.20347). "
        "Default: the preset's (ppo_clip except gspo and cispo).",
    )
    clip_ratio_low: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The ratio is clipped below at 1 - clipRatioLow (ppo_clip, gspo, clip_cov; cispo clips its "
        "importance weight there, 1 removes the lower bound; geo_mean clips the log-ratio at -clipRatioLow). "
        "Default: the preset's (0.2; gspo 3e-4, cispo 1).",
    )
    clip_ratio_high: float | None = Field(
        None,
        gt=0,
        le=10,
        description="The ratio is clipped above at 1 + clipRatioHigh (DAPO's clip-higher uses 0.28; geo_mean clips "
        "the log-ratio at +clipRatioHigh). Default: the preset's (0.2; dapo and cispo 0.28, gspo 4e-4).",
    )
    dual_clip_c: float | None = Field(
        3.0,
        gt=1,
        le=MAX_COEFFICIENT,
        description="ppo_clip only. Dual-clip PPO (Ye et al., arXiv 1912.09729): for negative advantages the loss "
        "is bounded by c * |A|. null turns dual clip off.",
    )
    clip_cov: ClipCovSpec | None = Field(
        None,
        description="policyLoss clip_cov (Clip-Cov, Cui et al., arXiv 2505.22617): which tokens lose their gradient. "
        "Only with policyLoss clip_cov; default then: ratio 2e-4, bounds 1 and 5.",
    )
    kl_cov: KLCovSpec | None = Field(
        None,
        description="policyLoss kl_cov (KL-Cov, Cui et al., arXiv 2505.22617): which tokens get a KL penalty. "
        "Only with policyLoss kl_cov; default then: ratio 2e-4, coef 1.",
    )
    sapo: SAPOSpec | None = Field(
        None,
        description="policyLoss sapo (SAPO, Gao et al., arXiv 2511.20347): the soft gate's temperatures. "
        "Only with policyLoss sapo; default then: 1 and 1.05.",
    )
    loss_aggregation: LossAggregation | None = Field(
        None,
        description="How token losses become one number: token_mean (DAPO), seq_mean_token_mean (GRPO), "
        "seq_mean_token_sum, seq_mean_token_sum_norm (Dr. GRPO: sum over tokens / maxNewTokens). gspo and "
        "geo_mean need seq_mean_token_mean. Default: seq_mean_token_mean for gspo, geo_mean and sapo "
        "(their papers' objectives), otherwise the preset's.",
    )
    dynamic_sampling: DynamicSamplingSpec | None = Field(
        None,
        description="DAPO's dynamic sampling: drop groups whose rewards are all equal and generate more until "
        "the batch is full. Default: on with name dapo, off otherwise.",
    )
    rollout_correction: RolloutCorrectionSpec | None = Field(
        None,
        description="Correct for the rollout engine's log-probs differing from the trainer's (kernels, bf16): "
        "truncated and/or masked importance sampling against the engine's log-probs.",
    )
    kl: KLSpec = Field(default_factory=KLSpec, description="The KL penalty toward the reference model.")
    entropy_coef: float = Field(
        0.0, ge=0, le=MAX_COEFFICIENT, description="Weight of the entropy bonus in the actor loss."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (gae, reinforce_plus_plus).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    value_clip: float | None = Field(
        0.2,
        gt=0,
        le=MAX_COEFFICIENT,
        description="Critic: clip the new value within +-valueClip of the old one; null turns it off.",
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="Passes of optimisation over each rollout batch.")
    mini_batch_size: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="Prompts per optimiser step (each with groupSize responses). Must divide data.batchSize. "
        "Default: data.batchSize (one optimiser step per batch per epoch).",
    )

    @model_validator(mode="after")
    def _fill_from_preset(self) -> "AlgorithmSpec":
        preset = ALGORITHM_PRESETS[self.name]
        if self.advantage_estimator is None:
            self.advantage_estimator = preset.estimator
        if self.normalize_advantage_std is None:
            self.normalize_advantage_std = preset.normalize_advantage_std
        if self.group_size is None:
            self.group_size = preset.group_size
        if self.policy_loss is None:
            self.policy_loss = preset.policy_loss
        if self.clip_ratio_low is None:
            self.clip_ratio_low = preset.clip_ratio_low
        if self.clip_ratio_high is None:
            self.clip_ratio_high = preset.clip_ratio_high
        if self.loss_aggregation is None:
            self.loss_aggregation = LOSS_DEFAULT_AGGREGATION.get(self.policy_loss, preset.loss_aggregation)
        for section, loss in LOSS_KNOB_SECTIONS.items():
            if self.policy_loss == loss and getattr(self, section) is None:
                setattr(self, section, LOSS_KNOB_MODELS[section]())
        if self.dynamic_sampling is None and preset.dynamic_sampling:
            self.dynamic_sampling = DynamicSamplingSpec()
        if self.kl.coef is None:
            self.kl.coef = preset.kl_coef
        if self.kl.placement is None:
            self.kl.placement = preset.kl_placement
        if self.kl.estimator is None:
            # k3 is unbiased and low-variance in a loss; in a per-token reward the plain log-ratio k1 is the norm.
            self.kl.estimator = KLEstimator.K3 if self.kl.placement == KLPlacement.LOSS else KLEstimator.K1
        raise_rule_problems(self, ALGORITHM_RULES)
        return self
