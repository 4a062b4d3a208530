"""Rewards that never return are bounded: per sample (reward.sampleTimeoutSeconds, a function in its own
process), per batch (reward.batchTimeoutSeconds, the pool replaces the worker) and per step
(training.stepTimeoutSeconds, every wait of a step). Real child processes and a real local Ray.

Each call that could hang runs in a thread that must finish in time, so a missing bound fails the test
instead of hanging it.
"""

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kuberl.api.contract import ray_resource
from kuberl.api.enums import Role
from kuberl.api.resources import RoleResources
from kuberl.api.topology import HEAD_POOL, ActorGroup, reward_group
from kuberl.runtime.deadline import StepTimeoutError, step_deadline
from kuberl.runtime.pools.autoscale import ScalePolicy
from kuberl.runtime.pools.reward import RewardPool
from kuberl.runtime.workers.group import WorkerGroup
from kuberl.runtime.workers.reward_worker import RewardWorker

pytestmark = pytest.mark.integration

REWARDS = "tests.integration.runtime.slow_rewards"


def samples(n: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    return [f"prompt {i}" for i in range(n)], [f"response {i}" for i in range(n)], [{"index": i} for i in range(n)]


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """call() in a thread that must end within `seconds`; its result, or what it raised."""
    out: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            out.append((call(), None))
        except BaseException as error:  # handed to the test
            out.append((None, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"still waiting after {seconds} s"
    value, error = out[0]
    if error is not None:
        raise error
    return value


def in_step(step: int, seconds: float, call: Callable[[], Any]) -> Callable[[], Any]:
    """call, run inside a step's deadline (on the thread that runs it, as the controller does)."""

    def run() -> Any:
        with step_deadline(step, seconds):
            return call()

    return run


@pytest.mark.parametrize(
    ("function", "reason"),
    [
        ("sleep_forever_on_index_1", "took longer than 1 s on this sample (spec.reward.sampleTimeoutSeconds)"),
        ("exit_on_index_1", "ended its process (exit code 3) on this sample"),
    ],
)
def test_a_reward_function_that_never_returns_or_dies_fails_only_that_sample(function: str, reason: str) -> None:
    worker = RewardWorker()
    worker.setup({"function": f"{REWARDS}:{function}", "sampleTimeoutSeconds": 1})
    try:
        results = within(15, lambda: worker.score(*samples(4)))
        again = within(15, lambda: worker.score(*samples(1)))  # a new child process took over
    finally:
        worker.function.close()
    assert [result.score for result in results] == [0.0, 0.0, 2.0, 3.0]
    assert [i for i, result in enumerate(results) if result.error] == [1]
    assert reason in results[1].error and f"{REWARDS}:{function}" in results[1].error
    assert again[0].score == 0.0 and again[0].error is None


def test_a_worker_stuck_past_the_batch_timeout_is_replaced_and_the_batch_fails(ray_session: Any) -> None:
    reward = {
        "function": f"{REWARDS}:sleep_forever_on_index_1",
        "sampleTimeoutSeconds": 3600,  # only the batch deadline can end it
        "batchTimeoutSeconds": 1,
        "batchSize": 2,
    }
    pool = RewardPool(reward, None, reward_group(RoleResources(cpus=0.2)), policy=ScalePolicy(max_batch_attempts=2))
    try:
        results = within(60, lambda: pool.score(*samples(6)))
        metrics = pool.metrics()
    finally:
        pool.shutdown()
    # batch [0, 1] outlived its worker twice and gave up; [2, 3] and [4, 5] went to the replacements
    assert [result.score for result in results] == [0.0, 0.0, 2.0, 3.0, 4.0, 5.0]
    assert [i for i, result in enumerate(results) if result.error] == [0, 1]
    assert "spec.reward.batchTimeoutSeconds" in results[0].error and "gave up after 2 attempts" in results[0].error
    assert metrics["reward/batch_timeouts"] == 2


def test_the_reward_pool_waits_no_longer_than_the_step_has_left(ray_session: Any) -> None:
    reward = {"function": f"{REWARDS}:sleep_forever_on_index_1", "sampleTimeoutSeconds": 3600, "batchSize": 2}
    pool = RewardPool(reward, None, reward_group(RoleResources(cpus=0.2)))
    try:
        with pytest.raises(StepTimeoutError) as timed_out:
            within(20, in_step(7, 2, lambda: pool.score(*samples(4))))
    finally:
        pool.shutdown()
    assert "step 7 did not finish within spec.training.stepTimeoutSeconds (2 s)" in str(timed_out.value)
    assert "the reward pool (0 of 4 samples scored)" in str(timed_out.value)  # its one worker is stuck on [0, 1]


class Napper:
    """A stand-in for a model worker whose call never ends (a hung collective, an engine that never answers)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


def test_a_worker_group_call_waits_no_longer_than_the_step_has_left(ray_session: Any) -> None:
    one_on_the_head = ActorGroup(
        name=Role.ACTOR,
        roles=(Role.ACTOR,),
        pool=HEAD_POOL,
        actors=1,
        min_actors=1,
        max_actors=1,
        actors_per_pod=1,
        cpus=0.1,
        gpus=0,
        resource=ray_resource(HEAD_POOL),
    )
    group = WorkerGroup(Napper, one_on_the_head)
    try:
        assert group.call("nap", 0.0) == [0]  # outside a step: unbounded, as before
        with pytest.raises(StepTimeoutError) as timed_out:
            within(20, in_step(3, 1.5, lambda: group.call("nap", 3600)))  # an hour's nap, cut at 1.5 s
    finally:
        group.kill()
    assert "step 3 did not finish" in str(timed_out.value) and "nap on the actor workers" in str(timed_out.value)


def scored_once(function: str, n: int) -> list[Any]:
    """`n` samples scored by a reward worker of `function` in its own process, which is then closed."""
    worker = RewardWorker()
    worker.setup({"function": function, "sampleTimeoutSeconds": 10})
    try:
        return list(within(30, lambda: worker.score(*samples(n))))
    finally:
        worker.function.close()


def test_a_reward_process_starts_wherever_the_run_was_started(tmp_path, monkeypatch) -> None:
    """A reward function runs in a process of its own, started as `python -m`. From a checkout of this repository,
    whose operator/ is named like the standard library's `operator`, that child found the folder first on Python
    3.12 and later (a `-m` child puts its working directory first on its path) and failed at its first import.
    Python 3.11, this suite's, imports `operator` before it reads the path, so the folder here is named like a
    module the child imports only later, `json`: a child that puts its working directory on its path fails alike."""
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("raise ImportError('the working directory hid the stdlib')\n")
    monkeypatch.chdir(tmp_path)
    results = scored_once(f"{REWARDS}:slow_score", 2)
    assert [(result.score, result.error) for result in results] == [(0.0, None), (1.0, None)]


def test_a_reward_module_in_the_working_directory_is_found_by_the_reward_process(tmp_path, monkeypatch) -> None:
    """A run started as `python -c` (or a notebook) imports from its working directory through '' on its path;
    the reward's process, which does not put its working directory on its path, gets that folder by name."""
    (tmp_path / "rewards_beside_the_job.py").write_text("def score(completion, sample):\n    return 7.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")
    monkeypatch.delitem(sys.modules, "rewards_beside_the_job", raising=False)
    try:
        results = scored_once("rewards_beside_the_job:score", 1)
    finally:
        sys.modules.pop("rewards_beside_the_job", None)
    assert [(result.score, result.error) for result in results] == [(7.0, None)]
