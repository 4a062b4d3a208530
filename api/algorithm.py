"""`spec.algorithm`: which RL algorithm, and the knobs of its advantage estimator, loss and KL term.

`name` is a preset. Fields left unset take the preset's value from `ALGORITHM_PRESETS`, so
`name: grpo` alone is a complete GRPO configuration and any field can still be overridden.
"""

from dataclasses import dataclass

from pydantic import Field, model_validator

from kuberl.api.base import KuberlModel
from kuberl.api.enums import (
    AdvantageEstimator,
    AlgorithmName,
    KLEstimator,
    KLPlacement,
    LossAggregation,
    PolicyLoss,
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
    clip_ratio_high: float = 0.2


#: Where each preset comes from:
#: grpo — DeepSeekMath (arXiv 2402.03300): group-normalised rewards, k3 KL in the loss.
#: dr_grpo — "Understanding R1-Zero-Like Training" (arXiv 2503.20783): no std division, no length normalisation.
#: dapo — arXiv 2503.14476: clip-higher (0.28), token-level loss, no KL.
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


class KLSpec(KuberlModel):
    """The KL term that keeps the actor near the reference model."""

    coef: float | None = Field(
        None,
        ge=0,
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
        "One of grpo, dr_grpo, dapo, ppo, rloo, reinforce_pp, remax.",
    )
    advantage_estimator: AdvantageEstimator | None = Field(
        None,
        description="How advantages are computed from rewards (gae needs a critic). Default: the preset's.",
    )
    normalize_advantage_std: bool | None = Field(
        None,
        description="grpo estimator: divide group-centred rewards by the group's standard deviation "
        "(false gives Dr. GRPO). Default: the preset's.",
    )
    group_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Responses sampled per prompt. Group estimators (grpo, rloo, reinforce_plus_plus_baseline) "
        "need at least 2. Default: 8 for grpo/dr_grpo, 16 for dapo, 4 for rloo, 1 otherwise.",
    )
    policy_loss: PolicyLoss = Field(PolicyLoss.PPO_CLIP, description="Policy loss: PPO's clipped surrogate.")
    clip_ratio_low: float = Field(
        0.2, gt=0, lt=1, description="PPO clip: the ratio is clipped below at 1 - clipRatioLow."
    )
    clip_ratio_high: float | None = Field(
        None,
        gt=0,
        le=10,
        description="PPO clip: the ratio is clipped above at 1 + clipRatioHigh (DAPO's clip-higher uses 0.28). "
        "Default: the preset's (0.2 except dapo).",
    )
    dual_clip_c: float | None = Field(
        3.0,
        gt=1,
        description="Dual-clip PPO (Ye et al., arXiv 1912.09729): for negative advantages the loss is bounded by "
        "c * |A|. null turns dual clip off.",
    )
    loss_aggregation: LossAggregation | None = Field(
        None,
        description="How token losses become one number: token_mean (DAPO), seq_mean_token_mean (GRPO), "
        "seq_mean_token_sum, seq_mean_token_sum_norm (Dr. GRPO: sum over tokens / maxNewTokens). "
        "Default: the preset's.",
    )
    kl: KLSpec = Field(default_factory=KLSpec, description="The KL penalty toward the reference model.")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus in the actor loss.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (gae, reinforce_plus_plus).")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    value_clip: float | None = Field(
        0.2, gt=0, description="Critic: clip the new value within +-valueClip of the old one; null turns it off."
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="Passes of optimisation over each rollout batch.")
    mini_batch_size: int | None = Field(
        None,
        ge=1,
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
        if self.clip_ratio_high is None:
            self.clip_ratio_high = preset.clip_ratio_high
        if self.loss_aggregation is None:
            self.loss_aggregation = preset.loss_aggregation
        if self.kl.coef is None:
            self.kl.coef = preset.kl_coef
        if self.kl.placement is None:
            self.kl.placement = preset.kl_placement
        if self.kl.estimator is None:
            # k3 is unbiased and low-variance in a loss; in a per-token reward the plain log-ratio k1 is the norm.
            self.kl.estimator = KLEstimator.K3 if self.kl.placement == KLPlacement.LOSS else KLEstimator.K1
        raise_rule_problems(self, ALGORITHM_RULES)
        return self
