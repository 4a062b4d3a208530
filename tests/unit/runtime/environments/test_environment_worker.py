"""The environment worker, called in-process: an environment's bug fails its episode, never the worker."""

import math

import pytest

from kuberl.api import BUILTIN_ENVIRONMENTS as API_BUILTINS
from kuberl.runtime.environments import (
    BUILTIN_ENVIRONMENTS,
    Environment,
    EnvironmentConfigError,
    ModelTurn,
    Observation,
    load_environment,
)
from kuberl.runtime.workers.environment_worker import EnvironmentWorker


class Counter(Environment):
    closed: list[int] = []

    def step(self, turn: ModelTurn) -> Observation:
        if "raise" in turn.text:
            raise ValueError("a bug in the environment")
        if "string" in turn.text:
            return "not an observation"  # type: ignore[return-value]
        return Observation.end() if "stop" in turn.text else Observation.user("more")

    def reward(self, final: ModelTurn):
        return {"nan": math.nan, "none": None, "tuple": (0.5, {"turns": 2})}.get(final.text.split()[-1], 1.0)

    def close(self) -> None:
        Counter.closed.append(id(self))


@pytest.fixture
def worker() -> EnvironmentWorker:
    Counter.closed = []
    worker = EnvironmentWorker()
    worker.setup({"name": f"{__name__}:Counter", "maxTurns": 3})
    return worker


def test_an_episode_keeps_its_environment_until_it_ends_and_then_gets_its_reward(worker) -> None:
    first = worker.step((1, 0), {}, ModelTurn("hello"))
    assert first.observation == Observation.user("more") and first.reward is None
    assert (1, 0) in worker.episodes
    last = worker.step((1, 0), {}, ModelTurn("stop tuple"))
    assert last.observation.done and last.reward.score == 0.5 and last.reward.metrics == {"turns": 2.0}
    assert (1, 0) not in worker.episodes and len(Counter.closed) == 1


@pytest.mark.parametrize("text", ["raise", "string"])
def test_an_environment_that_breaks_fails_its_episode_with_the_reason(worker, text) -> None:
    reply = worker.step((1, 0), {}, ModelTurn(text))
    assert reply.failed is not None and reply.observation is None
    assert ("ValueError: a bug in the environment" in reply.failed) == (text == "raise")
    assert (1, 0) not in worker.episodes and len(Counter.closed) == 1
    assert worker.step((1, 1), {}, ModelTurn("stop")).reward.score == 1.0  # the next episode is unaffected


def test_a_reward_that_is_no_number_fails_the_sample_and_none_leaves_it_to_spec_reward(worker) -> None:
    assert worker.step((1, 0), {}, ModelTurn("stop none")).reward is None
    bad = worker.step((1, 1), {}, ModelTurn("stop nan")).reward
    assert bad.error is not None and "Counter.reward()" in bad.error


def test_finish_scores_an_episode_the_rollout_ended(worker) -> None:
    worker.step((1, 0), {}, ModelTurn("hello"))
    assert worker.finish((1, 0), {}, ModelTurn("cut off")).reward.score == 1.0
    assert worker.finish((1, 5), {}, ModelTurn("never stepped")).reward.score == 1.0


def test_a_new_rollout_closes_what_an_interrupted_one_left(worker) -> None:
    worker.step((1, 0), {}, ModelTurn("hello"))
    worker.step((2, 0), {}, ModelTurn("hello"))
    assert worker.begin(2) == 1 and list(worker.episodes) == [(2, 0)]


@pytest.mark.parametrize(
    ("ref", "phrase"),
    [
        ("bash", "unknown built-in environment 'bash'; built-ins are python"),
        ("no_such_package.envs:Game", "cannot import module 'no_such_package.envs'"),
        (f"{__name__}:Nope", "has no attribute 'Nope'"),
        (f"{__name__}:worker", "is not a subclass of kuberl.runtime.environments.Environment"),
    ],
)
def test_an_environment_that_cannot_be_used_is_refused_naming_the_field(ref, phrase) -> None:
    with pytest.raises(EnvironmentConfigError, match="spec.environment.name") as refused:
        load_environment(ref)
    assert phrase in str(refused.value)


def test_the_api_lists_exactly_the_built_in_environments() -> None:
    assert set(API_BUILTINS) == set(BUILTIN_ENVIRONMENTS)
