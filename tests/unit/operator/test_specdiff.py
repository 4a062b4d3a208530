"""Which spec changes restart a running job from its checkpoint, and which are refused."""

from typing import Any

import pytest

from kuberl.api import parse_rljob
from kuberl.api.specdiff import runtime_spec_changed, unsafe_changes
from tests.unit.operator.conftest import base_spec, make_rljob


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = base_spec()
    spec.update(changes)
    return spec


def parsed(spec: dict[str, Any]):
    return parse_rljob(make_rljob(spec)).spec


PPO = {"algorithm": {"name": "ppo"}, "models": {"actor": {"path": "hf://org/actor"}, "critic": {}}}
GRPO_ESTIMATOR = {"name": "ppo", "advantageEstimator": "grpo", "groupSize": 4}


@pytest.mark.parametrize(
    "change",
    [
        {"data": {"train": "/data/v2.jsonl"}},
        {"rollout": {"temperature": 0.7}},
        {"training": {"totalSteps": 500}},
        {"resources": {"actor": {"replicas": 4}}},
        {"models": {"actor": {"path": "hf://org/actor", "optim": {"lr": 1e-5}}}},
        {"image": "my.registry/rl:2"},
    ],
)
def test_safe_changes_have_no_objection(change: dict[str, Any]):
    assert unsafe_changes(parsed(base_spec()), parsed(spec_with(**change))) == []
    assert runtime_spec_changed(parsed(base_spec()), parsed(spec_with(**change)))


@pytest.mark.parametrize(
    ("running", "desired", "field"),
    [
        (base_spec(), spec_with(models={"actor": {"path": "hf://org/other"}}), "spec.models.actor.path"),
        (base_spec(), spec_with(algorithm={"name": "rloo"}), "spec.algorithm.name"),
        (spec_with(**PPO), spec_with(algorithm=GRPO_ESTIMATOR), "spec.models.critic"),
        (base_spec(), spec_with(checkpoint={"uri": "s3://bucket/elsewhere"}), "spec.checkpoint.uri"),
        (base_spec(), spec_with(checkpoint={"pvcClaimName": "other-claim"}), "spec.checkpoint.pvcClaimName"),
        (
            spec_with(**PPO),
            spec_with(**{**PPO, "models": {**PPO["models"], "critic": {"path": "hf://org/rm"}}}),
            "spec.models.critic.path",
        ),
        (
            base_spec(),
            spec_with(models={"actor": {"path": "hf://org/actor", "dtype": "bfloat16"}}),
            "spec.models.actor.dtype",
        ),
        (
            base_spec(),
            spec_with(models={"actor": {"path": "hf://org/actor", "lora": {"rank": 8}}}),
            "spec.models.actor.lora",
        ),
    ],
)
def test_unsafe_changes_name_the_field(running: dict, desired: dict, field: str):
    (problem,) = unsafe_changes(parsed(running), parsed(desired))
    assert problem.startswith(field)


def test_a_run_policy_change_is_not_a_runtime_change():
    assert not runtime_spec_changed(parsed(base_spec()), parsed(spec_with(runPolicy={"suspend": True})))


def test_spelling_out_a_default_is_not_a_change():
    assert not runtime_spec_changed(parsed(base_spec()), parsed(spec_with(algorithm={"name": "grpo"})))
