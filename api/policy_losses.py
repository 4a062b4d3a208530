"""The knobs of the policy losses that have their own, and which loss aggregations each loss admits.

`spec.algorithm.policyLoss` picks a loss; a loss with knobs of its own reads them from the section
named after it (`spec.algorithm.clipCov`, `.klCov`, `.sapo`). A section is filled with its defaults
when its loss is chosen, and refused when another loss is (a knob nobody reads is a mistake).

The clip range (`clipRatioLow` / `clipRatioHigh`) is shared: ppo_clip, gspo, clip_cov and geo_mean
clip the ratio with it, cispo clips its importance weight with it; gpg, kl_cov and sapo have no clip.
"""

from pydantic import Field, model_validator

from kuberl.api.base import KuberlModel
from kuberl.api.enums import LossAggregation, PolicyLoss
from kuberl.api.limits import MAX_COEFFICIENT


class ClipCovSpec(KuberlModel):
    """clip_cov: Clip-Cov of Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models" (arXiv 2505.22617)."""

    ratio: float = Field(
        0.0002,
        gt=0,
        le=1,
        description="Share of the tokens whose gradient Clip-Cov detaches, drawn at random among those whose "
        "covariance of advantage and log-prob lies between lowerBound and upperBound (arXiv 2505.22617).",
    )
    lower_bound: float = Field(
        1.0, ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT, description="Covariance above which a token may be detached."
    )
    upper_bound: float = Field(
        5.0, ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT, description="Covariance below which a token may be detached."
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> "ClipCovSpec":
        if self.lower_bound >= self.upper_bound:
            raise ValueError(f"lowerBound ({self.lower_bound}) must be below upperBound ({self.upper_bound})")
        return self


class KLCovSpec(KuberlModel):
    """kl_cov: KL-Cov of Cui et al. (arXiv 2505.22617)."""

    ratio: float = Field(
        0.0002,
        gt=0,
        le=1,
        description="Share of the tokens with the largest covariance of advantage and log-prob that get the "
        "|log-ratio| penalty (KL-Cov, arXiv 2505.22617).",
    )
    coef: float = Field(
        1.0, ge=0, le=MAX_COEFFICIENT, description="Weight of the |log pi - log pi_old| penalty on those tokens."
    )


class SAPOSpec(KuberlModel):
    """sapo: Soft Adaptive Policy Optimization (Gao et al., arXiv 2511.20347)."""

    tau_positive: float = Field(
        1.0,
        gt=0,
        le=MAX_COEFFICIENT,
        description="Temperature of SAPO's soft gate sigmoid(tau * (r - 1)) * 4 / tau for tokens with a positive "
        "advantage (arXiv 2511.20347); larger tau closes the gate faster as the ratio leaves 1.",
    )
    tau_negative: float = Field(
        1.05,
        gt=0,
        le=MAX_COEFFICIENT,
        description="The gate's temperature for tokens with a zero or negative advantage.",
    )


#: Losses whose objective is per sequence: one ratio (gspo: the length-normalised sequence ratio; geo_mean:
#: the geometric mean of the token ratios) per response, so every response must weigh the same.
SEQUENCE_LEVEL_LOSSES = frozenset({PolicyLoss.GSPO, PolicyLoss.GEO_MEAN})

#: The aggregation a loss brings when spec.algorithm.lossAggregation is unset; others take the preset's.
LOSS_DEFAULT_AGGREGATION: dict[PolicyLoss, LossAggregation] = {
    PolicyLoss.GSPO: LossAggregation.SEQ_MEAN_TOKEN_MEAN,  # GSPO, arXiv 2507.18071 eq. 5
    PolicyLoss.GEO_MEAN: LossAggregation.SEQ_MEAN_TOKEN_MEAN,  # GMPO, arXiv 2507.20673 eq. 3
    PolicyLoss.SAPO: LossAggregation.SEQ_MEAN_TOKEN_MEAN,  # SAPO, arXiv 2511.20347
}

#: The sections of knobs, by the loss that reads them (the field name on AlgorithmSpec).
LOSS_KNOB_SECTIONS: dict[str, PolicyLoss] = {
    "clip_cov": PolicyLoss.CLIP_COV,
    "kl_cov": PolicyLoss.KL_COV,
    "sapo": PolicyLoss.SAPO,
}
LOSS_KNOB_MODELS: dict[str, type[KuberlModel]] = {"clip_cov": ClipCovSpec, "kl_cov": KLCovSpec, "sapo": SAPOSpec}
