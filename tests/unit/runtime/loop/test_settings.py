"""A step's settings (loop/settings.py StepSettings), resolved once from the spec, as each preset means them."""

import re

import pytest

from kuberl.api import KLPlacement
from kuberl.runtime.loop.settings import step_settings
from tests.conftest import REPO
from tests.integration.runtime.jobs import demo_job


def settings_of(mini_batches: int = 1, world: int = 2, **changes: object):
    return step_settings(demo_job(**changes).spec, mini_batches=mini_batches, actor_world_size=world)


def test_grpo_samples_a_group_per_prompt_and_puts_k3_kl_in_the_loss() -> None:
    settings = settings_of(**{"algorithm.name": "grpo", "algorithm.groupSize": None, "algorithm.kl": None})
    assert settings.group_size == 8  # GRPO's preset (api/algorithm.py)
    assert settings.kl.placement == KLPlacement.LOSS and settings.kl.estimator == "k3" and not settings.kl.in_reward
    assert settings.update.kl_in_loss_coef == settings.kl.coef > 0
    assert settings.update.on_policy  # one epoch, one mini-batch, nothing reads pi_old before the update


def test_kl_in_the_reward_is_k1_and_needs_the_old_log_probs_as_a_pass_of_their_own() -> None:
    settings = settings_of(**{"algorithm.kl": {"coef": 0.05, "placement": "reward"}})
    assert settings.kl.in_reward and settings.kl.estimator == "k1"  # PPO's reward KL (api/algorithm.py)
    assert settings.update.kl_in_loss_coef == 0.0
    assert not settings.update.on_policy  # the reward's KL reads pi_old before the update


def test_dapo_shapes_overlong_responses_within_a_fifth_of_the_budget() -> None:
    settings = settings_of(**{"algorithm.name": "dapo", "rollout.maxNewTokens": 20})
    assert settings.overlong is not None and settings.overlong.buffer_length == 4  # 20 // 5
    assert settings.max_response_tokens == settings.sampling.max_new_tokens == 20
    assert settings_of(**{"algorithm.name": "grpo"}).overlong is None


def test_two_mini_batches_need_the_old_log_probs_before_the_update() -> None:
    assert not settings_of(mini_batches=2).update.on_policy
    assert settings_of(mini_batches=2).update.mini_batches == 2


def test_sampling_is_the_rollouts_and_the_seed_the_trainings() -> None:
    settings = settings_of(**{"rollout.temperature": 0.7, "rollout.topP": 0.9, "training.seed": 11})
    assert (settings.sampling.temperature, settings.sampling.top_p, settings.sampling.seed) == (0.7, 0.9, 11)
    assert settings.update.temperature == 0.7 and settings.update.seed == 11


def test_a_spec_not_filled_in_by_the_api_is_refused() -> None:
    spec = demo_job().spec
    spec.algorithm.group_size = None  # as a spec built without parse_rljob would be
    with pytest.raises(ValueError, match="parse_rljob"):
        step_settings(spec, mini_batches=1, actor_world_size=1)


def test_no_runtime_code_fills_in_the_group_size_again() -> None:
    """The API fills algorithm.groupSize from the preset; a second default in the runtime could disagree."""
    refills = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "runtime").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"group_size\s+or\s+\d", line)
    ]
    assert refills == []


def test_a_token_baseline_estimator_needs_the_old_log_probs_as_a_pass_of_their_own() -> None:
    settings = settings_of(**{"algorithm.advantageEstimator": "optimal_token_baseline"})
    assert not settings.update.on_policy  # the estimator reads pi_old and sum_v pi(v)^2 before the update
