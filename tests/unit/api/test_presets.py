"""The algorithm presets: what each fills in, and what the losses and DAPO's sections bring with them."""

import pytest

from kuberl.api import ALGORITHM_PRESETS, AlgorithmName, PolicyLoss, parse_rljob
from kuberl.api.enums import LossAggregation
from tests.unit.api.test_rules import spec_with

#: The presets the issue asks for, by name (a test keeps the enum in step with it).
PRESETS = {"grpo", "dr_grpo", "dapo", "gspo", "ppo", "rloo", "reinforce_pp", "remax", "cispo"}


def algorithm(changes: dict):
    return parse_rljob(spec_with({f"algorithm.{k}": v for k, v in changes.items()})).spec


def test_every_preset_named_in_the_issue_exists() -> None:
    assert {name.value for name in AlgorithmName} == PRESETS == {name.value for name in ALGORITHM_PRESETS}


def test_dapo_turns_on_dynamic_sampling_and_the_overlong_penalty() -> None:
    spec = algorithm({"name": "dapo"})
    assert spec.algorithm.dynamic_sampling is not None and spec.algorithm.dynamic_sampling.enabled
    assert spec.algorithm.dynamic_sampling.metric == "score"
    penalty = spec.reward.overlong_penalty
    # a fifth of the budget, as DAPO's 4096 of 20480 (maxNewTokens defaults to 256)
    assert penalty is not None and penalty.enabled and penalty.buffer_length == 51 and penalty.penalty_factor == 1.0


def test_dapo_pieces_can_be_switched_off_and_others_leave_them_off() -> None:
    spec = parse_rljob(
        spec_with(
            {
                "algorithm.name": "dapo",
                "algorithm.dynamicSampling": {"enabled": False},
                "reward.overlongPenalty": {"enabled": False},
            }
        )
    ).spec
    assert not spec.algorithm.dynamic_sampling.enabled and not spec.reward.overlong_penalty.enabled
    grpo = algorithm({"name": "grpo"})
    assert grpo.algorithm.dynamic_sampling is None and grpo.reward.overlong_penalty is None


def test_gspo_preset_is_the_papers_sequence_clip() -> None:
    algo = algorithm({"name": "gspo"}).algorithm
    assert algo.policy_loss == PolicyLoss.GSPO
    assert (algo.clip_ratio_low, algo.clip_ratio_high) == (0.0003, 0.0004)
    assert algo.loss_aggregation == LossAggregation.SEQ_MEAN_TOKEN_MEAN and algo.kl.coef == 0.0


def test_cispo_preset_has_no_lower_bound_on_its_weight() -> None:
    algo = algorithm({"name": "cispo"}).algorithm
    assert algo.policy_loss == PolicyLoss.CISPO and algo.clip_ratio_low == 1.0
    assert algo.loss_aggregation == LossAggregation.TOKEN_MEAN


@pytest.mark.parametrize(
    ("loss", "section", "knobs"),
    [
        ("clip_cov", "clip_cov", {"ratio": 0.0002, "lower_bound": 1.0, "upper_bound": 5.0}),
        ("kl_cov", "kl_cov", {"ratio": 0.0002, "coef": 1.0}),
        ("sapo", "sapo", {"tau_positive": 1.0, "tau_negative": 1.05}),
    ],
)
def test_a_loss_with_knobs_gets_its_section_with_defaults(loss: str, section: str, knobs: dict) -> None:
    algo = algorithm({"policyLoss": loss}).algorithm
    assert getattr(algo, section).model_dump() == knobs
    assert all(getattr(algo, other) is None for other in ("clip_cov", "kl_cov", "sapo") if other != section)


@pytest.mark.parametrize("loss", ["gspo", "geo_mean", "sapo"])
def test_sequence_objectives_bring_their_aggregation_over_the_presets(loss: str) -> None:
    assert algorithm({"name": "dapo", "policyLoss": loss}).algorithm.loss_aggregation == "seq_mean_token_mean"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_survives_the_round_trip(name: str) -> None:
    # workers and checkpoints get the job back from to_manifest(): the filled-in values must parse again
    job = parse_rljob(spec_with({"algorithm.name": name, "models.critic": {}}))
    assert parse_rljob(job.to_manifest()).spec == job.spec
