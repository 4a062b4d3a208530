"""Which workers an elastic pool releases when it shrinks, and how: the scheduler's decisions, run here without Ray.

`RecordingPool` is a FAKE pool for this: its workers are plain records with no actor, it has no queue, its
`_kill` records the worker instead of killing an actor, and `StoppingPool`'s stop call is a string naming the
worker (what the rollout pool's is: the engine's shutdown, asked of the actor). `_rescale`, `_release` and
`_release_all` are ElasticPool's own."""

import time
from dataclasses import dataclass
from typing import Any

import pytest

from kuberl.api.resources import RoleResources
from kuberl.api.topology import rollout_group
from kuberl.runtime.pools.autoscale import ScalePolicy
from kuberl.runtime.pools.elastic import STOP_TIMEOUT_S, ElasticPool, PoolWorker

NOW = 0.0  # the pool's clock as the test began (`_now`); a release also reads the clock itself for its stop's deadline


@pytest.fixture(autouse=True)
def _now() -> None:
    """Read as each test begins, not at import: a test may run many minutes after its module was imported (two
    pytest-xdist workers import every module first; they ran this one 20 min later), and the release's own reading
    of the clock must stay within the deadlines compared."""
    global NOW
    NOW = time.monotonic()


@dataclass
class FakeWorker(PoolWorker):
    ready: bool = True


class RecordingPool(ElasticPool[FakeWorker]):
    """FAKE: an elastic pool of worker records (no Ray actors), whose releases are recorded in `killed`."""

    def __init__(self, workers: list[FakeWorker]) -> None:
        group = rollout_group(RoleResources(replicas=1, minReplicas=1, maxReplicas=3, cpus=1))
        super().__init__(group, ScalePolicy(idle_release_s=10.0))
        self._workers = {worker.number: worker for worker in workers}
        self.killed: list[int] = []

    def _calls_of(self, worker: FakeWorker) -> list[Any]:
        return [] if worker.ready else [f"setup of {worker.number}"]

    def _is_ready(self, worker: FakeWorker) -> bool:
        return worker.ready

    def _idle(self) -> list[FakeWorker]:
        return [worker for worker in self._workers.values() if worker.ready]

    def _queue_state(self, now: float) -> tuple[int, float]:
        return 0, 0.0

    def _kill(self, number: int, actor: Any) -> None:
        self.killed.append(number)


class StoppingPool(RecordingPool):
    """FAKE, as RecordingPool, for a pool whose released workers get a stop call (the rollout pool's)."""

    def _stop_call(self, worker: FakeWorker) -> Any:
        return f"stop of {worker.number}"


def worker(number: int, idle_for: float, ready: bool = True, started_ago: float = 60) -> FakeWorker:
    return FakeWorker(number, actor=None, started_at=NOW - started_ago, idle_since=NOW - idle_for, ready=ready)


def stopping(pool: RecordingPool) -> list[tuple[int, Any, float]]:
    return [(s.number, s.call, s.kill_at) for s in pool._stopping]


def test_a_shrinking_pool_releases_a_worker_still_setting_up_before_a_ready_one():
    # Seen in busy CI runs: replicas 1 and 2 did a burst's work while 3 was still starting; once 1 and 2 had
    # been idle long enough, the pool released both and kept 3, so the next request waited for it to start.
    pool = RecordingPool([worker(1, idle_for=50), worker(2, idle_for=40), worker(3, idle_for=0, ready=False)])
    pool._rescale(NOW)
    assert pool.killed == [3, 1]  # the one setting up, then the longest idle
    assert list(pool._workers) == [2]  # minReplicas 1: a ready worker is kept
    assert [(event.before, event.after) for event in pool.scale_events] == [(3, 1)]


def test_a_worker_setting_up_is_kept_while_no_ready_worker_has_been_idle_long_enough():
    pool = RecordingPool([worker(1, idle_for=5), worker(2, idle_for=0, ready=False)])
    pool._rescale(NOW)
    assert pool.killed == [] and list(pool._workers) == [1, 2]


def test_a_worker_released_while_setting_up_is_stopped_once_its_setup_ends_not_killed_halfway():
    # a tensor-parallel vLLM replica killed halfway through its start leaves the shared-memory queues it made
    pool = StoppingPool([worker(1, idle_for=50), worker(2, idle_for=0, ready=False, started_ago=20)])
    pool._rescale(NOW)
    assert list(pool._workers) == [1] and pool.killed == []
    ((number, call, kill_at),) = stopping(pool)
    assert (number, call) == (2, "stop of 2")
    # the stop waits behind the setup, which may go on until its start timeout: the kill waits past that
    assert kill_at == NOW - 20 + pool.policy.start_timeout_s + STOP_TIMEOUT_S


def test_a_worker_whose_setup_ran_past_its_start_timeout_is_killed_at_once():
    # never placed (no room, no pod) or stuck: a stop call behind its setup would never run
    late = ScalePolicy().start_timeout_s + 1
    pool = StoppingPool([worker(1, idle_for=0), worker(2, idle_for=0, ready=False, started_ago=late)])
    pool._rescale(NOW)
    assert pool.killed == [2] and stopping(pool) == [] and list(pool._workers) == [1]


def test_at_shutdown_a_worker_still_setting_up_is_killed_at_once_and_an_idle_one_is_stopped():
    # the job is ending: it must not wait for a start to finish
    pool = StoppingPool([worker(1, idle_for=5), worker(2, idle_for=0, ready=False)])
    pool._release_all()
    assert pool.killed == [2]
    assert [(number, call) for number, call, _ in stopping(pool)] == [(1, "stop of 1")]
    assert pool._workers == {}
