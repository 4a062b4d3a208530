"""The episode rollout on a real engine (the hf engine in a rollout worker) and real environment workers.

The environments (tests/integration/runtime/environments.py) reply to whatever the random tiny model
writes, so every path of the scheduler runs: turns, budgets, environments that end an episode, that
score it, that break, and one that makes a tool slow.
"""

import pytest

from kuberl.api import EnvironmentSpec, RoleResources
from kuberl.api.topology import environment_group, rollout_group
from kuberl.runtime.data import Prompt
from kuberl.runtime.loop.settings import step_settings
from kuberl.runtime.models.resolve import ModelLocation, default_cache_dir, resolve_model_path
from kuberl.runtime.pools.environment import EnvironmentPool
from kuberl.runtime.pools.rollout import RolloutPool
from kuberl.runtime.rollout.base import Engines
from kuberl.runtime.rollout.episodes import EpisodeRollout
from tests.integration.runtime.jobs import demo_job

pytestmark = pytest.mark.integration

ENVIRONMENTS = "tests.integration.runtime.environments"
GROUP_SIZE = 2


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(resolve_model_path("tiny://demo", default_cache_dir(), "test"))


@pytest.fixture(scope="module")
def engines(ray_session, model_path):
    job = demo_job(**{"rollout.engine": "hf"})
    model = ModelLocation(model_path, "spec.models.actor.path")
    pool = RolloutPool(job.to_manifest(), model, model, rollout_group(RoleResources(replicas=1, cpus=0.5)))
    yield Engines(actor=None, rollout=pool)
    pool.shutdown()


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def episodes_of(environment: dict, engines, tokenizer, records: list[dict], *, group_size: int = GROUP_SIZE):
    """A rollout of one step over `records` (a prompt each); returns the stage, its batch and metrics."""
    changes = {"rollout.engine": "hf", "rollout.maxNewTokens": 6, "algorithm.groupSize": group_size}
    spec = demo_job(**changes, environment=environment).spec
    pool = EnvironmentPool(EnvironmentSpec.model_validate(environment), environment_group(RoleResources(cpus=1)))
    try:
        sampling = step_settings(spec, mini_batches=1, actor_world_size=1).sampling
        stage = EpisodeRollout(spec, sampling, tokenizer, engines, pool, group_size, tokenizer.pad_token_id)
        prompts = [
            Prompt(i, tokenizer(f"count: {i} {i + 1}")["input_ids"], "", record) for i, record in enumerate(records)
        ]
        batch = stage.run(prompts, step=0)
        return stage, batch, stage.take_metrics()
    finally:
        pool.shutdown()


def test_a_slow_tool_holds_back_no_other_episode(engines, tokenizer) -> None:
    # Prompt 0's two episodes block in their first step until the six others have ended: a rollout with
    # a barrier per turn would keep those six waiting for prompt 0 and the slow step would time out.
    records = [{"wait_for": 6}, {}, {}, {}]
    environment = {"name": f"{ENVIRONMENTS}:WaitsForTheOthers", "maxTurns": 3, "maxEpisodeTokens": 60}
    stage, batch, metrics = episodes_of(environment, engines, tokenizer, records)
    spans = stage.last_spans
    slow_rows = {0, 1}
    (slow_start, slow_end) = max(
        ((s.started, s.ended) for s in spans if s.kind == "environment" and set(s.rows) <= slow_rows),
        key=lambda span: span[1] - span[0],
    )
    during = [s for s in spans if s.kind == "generate" and slow_start < s.started and s.ended < slow_end]
    # the six other episodes wrote their second and third messages while the slow tool ran
    assert len(during) >= 2 and all(set(s.rows).isdisjoint(slow_rows) for s in during)
    assert {row for s in during for row in s.rows} == set(range(2, 8))
    assert slow_end - slow_start < 50, "the slow step waited out its timeout: the others were held back"
    assert batch.turns.tolist() == [3] * 8 and metrics["env/ended_max_turns"] == 8


def test_episodes_end_by_their_budget_and_their_environments_reward(engines, tokenizer) -> None:
    environment = {"name": f"{ENVIRONMENTS}:ScoresTurns", "maxTurns": 4, "maxEpisodeTokens": 40}
    _, batch, metrics = episodes_of(environment, engines, tokenizer, [{"stop_after": 2}, {"stop_after": 9}])
    ended = [reward.score for reward in batch.environment_rewards]
    assert ended[:2] == [2.0, 2.0]  # the environment ended them after two messages and scored them itself
    assert batch.turns.tolist()[:2] == [2, 2]
    # the others ran into maxTurns (4) or the token budget first; either way the environment scored them
    assert all(reward.error is None for reward in batch.environment_rewards)
    assert metrics["env/ended_environment"] == 2
    assert metrics["env/ended_max_turns"] + metrics["env/ended_budget"] == 2
    assert int(batch.response_attention_mask.sum(-1).max()) < 40


def test_an_environment_that_breaks_makes_failed_samples_and_the_rest_go_on(engines, tokenizer) -> None:
    environment = {"name": f"{ENVIRONMENTS}:FailsOnSecondTurn", "maxTurns": 3, "maxEpisodeTokens": 60}
    _, batch, metrics = episodes_of(environment, engines, tokenizer, [{"fail": True}, {}])
    failed = [reward is not None and reward.error is not None for reward in batch.environment_rewards]
    assert failed == [True, True, False, False]
    assert "environment failed: RuntimeError: the environment broke" in batch.environment_rewards[0].error
    assert metrics["env/ended_failed"] == 2 and metrics["env/ended_max_turns"] == 2
    assert batch.turns.tolist() == [2, 2, 3, 3]
