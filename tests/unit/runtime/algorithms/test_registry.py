"""The registries: names match the RLJob enums, lookups fail helpfully, names are registered once."""

from enum import StrEnum

import pytest

import kuberl.runtime.algorithms  # noqa: F401  (fills the registries)
from kuberl.api.enums import AdvantageEstimator, KLEstimator, LossAggregation, PolicyLoss
from kuberl.runtime.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
)


@pytest.mark.parametrize(
    ("registry", "enum"),
    [
        (ADVANTAGE_ESTIMATORS, AdvantageEstimator),
        (POLICY_LOSSES, PolicyLoss),
        (KL_ESTIMATORS, KLEstimator),
        (LOSS_AGGREGATIONS, LossAggregation),
    ],
    ids=lambda value: getattr(value, "kind", ""),
)
def test_registry_names_equal_the_enum_values_a_user_can_write(registry: Registry, enum: type[StrEnum]) -> None:
    assert registry.names() == sorted(member.value for member in enum)


def test_registering_a_name_twice_raises() -> None:
    widgets: Registry = Registry("widget")

    @widgets.register("spin")
    def spin() -> None: ...

    with pytest.raises(ValueError, match="widget 'spin' is already registered"):

        @widgets.register("spin")
        def spin_again() -> None: ...

    assert widgets.get("spin") is spin


def test_unknown_name_lists_the_known_names_sorted() -> None:
    with pytest.raises(UnknownNameError) as caught:
        ADVANTAGE_ESTIMATORS.get("grpoo")
    assert str(caught.value) == (
        "unknown advantage estimator 'grpoo'; known: gae, gpg, grpo, grpo_passk, opo, optimal_token_baseline, "
        "reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo, tir_optimal_token_baseline"
    )


def test_unknown_name_error_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        KL_ESTIMATORS.get("k4")


def test_enum_members_work_as_names() -> None:
    assert KL_ESTIMATORS.get(KLEstimator.K3) is KL_ESTIMATORS.get("k3")
    assert LossAggregation.TOKEN_MEAN in LOSS_AGGREGATIONS


def test_contains_answers_for_known_and_unknown_names() -> None:
    assert "ppo_clip" in POLICY_LOSSES
    assert "ppo" not in POLICY_LOSSES
    assert 3 not in POLICY_LOSSES
