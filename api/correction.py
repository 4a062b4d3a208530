"""`spec.algorithm.rolloutCorrection`: importance sampling against the rollout engine's log-probs.

The engine that samples (vLLM, bf16 kernels) and the trainer that learns (FSDP, fp32) assign the
same tokens slightly different probabilities, so the samples are a little off-policy even right
after a weight sync. Following verl's rollout correction ("When Speed Kills Stability", Yao et al.
2025), the weight w = pi_trainer / pi_engine of each token (or the product over a sequence) is
- truncated at `isThreshold` and multiplied into the policy loss (truncated IS, TIS), and/or
- checked against `[rejectionThresholdLow, rejectionThresholdHigh]`: a token, or a whole sequence,
  outside is left out of the loss (masked IS, MIS).

Two ways to use the engine's log-probs, chosen by `spec.rollout.useEngineLogprobs`:
- false (decoupled, the default): the trainer recomputes log pi_old, the PPO ratio is pi / pi_old,
  and w = pi_old / pi_engine corrects for the engine. With one PPO epoch over one mini-batch and no
  rejection, log pi_old is the update's own forward pass, detached, and w is computed there: no extra pass.
- true (bypass): the engine's log-probs are log pi_old, so no recompute pass runs and the PPO ratio
  is pi / pi_engine itself: truncating it again would count the correction twice, so only the
  rejection applies there, with w = pi / pi_engine.
"""

from pydantic import Field, model_validator

from kuberl.api.base import KuberlModel
from kuberl.api.enums import ImportanceSamplingLevel, RejectionLevel


class RolloutCorrectionSpec(KuberlModel):
    """Truncated (TIS) and masked (MIS) importance sampling against the engine's log-probs."""

    importance_sampling: ImportanceSamplingLevel | None = Field(
        None,
        description="Truncated importance sampling: token (each token's pi_old / pi_engine) or sequence (their "
        "product over the response), truncated at isThreshold and multiplied into the policy loss. "
        "null: no weights. Not with rollout.useEngineLogprobs (the PPO ratio already is the weight there).",
    )
    is_threshold: float = Field(
        2.0, ge=1, le=1e6, description="Upper bound of the truncated importance weight (verl's default 2)."
    )
    rejection: RejectionLevel | None = Field(
        None,
        description="Masked importance sampling: leave out of the loss a token (token), a response whose weight "
        "product (sequence) or geometric mean (geometric) lies outside [rejectionThresholdLow, "
        "rejectionThresholdHigh]. null: reject nothing.",
    )
    rejection_threshold_high: float = Field(2.0, gt=1, le=1e6, description="Largest weight kept.")
    rejection_threshold_low: float | None = Field(
        None, gt=0, lt=1, description="Smallest weight kept. Default: 1 / rejectionThresholdHigh."
    )

    @model_validator(mode="after")
    def _does_something(self) -> "RolloutCorrectionSpec":
        if self.importance_sampling is None and self.rejection is None:
            raise ValueError(
                "rolloutCorrection sets neither importanceSampling nor rejection, so it would change nothing; "
                "choose one of them, or remove rolloutCorrection"
            )
        if self.rejection_threshold_low is None:
            self.rejection_threshold_low = 1.0 / self.rejection_threshold_high
        return self
