"""Which workers an elastic pool releases when it shrinks: the scheduler's decision, run here without Ray.

`RecordingPool` is a FAKE pool for this: its workers are plain records with no actor, it has no queue, and its
`_kill` records the worker instead of killing an actor. `_rescale` itself is ElasticPool's own."""

from dataclasses import dataclass
from typing import Any

from kuberl.api.resources import RoleResources
from kuberl.api.topology import rollout_group
from kuberl.runtime.autoscale import ScalePolicy
from kuberl.runtime.elastic_pool import ElasticPool, PoolWorker

NOW = 1000.0


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


def worker(number: int, idle_for: float, ready: bool = True) -> FakeWorker:
    return FakeWorker(number, actor=None, started_at=NOW - 60, idle_since=NOW - idle_for, ready=ready)


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
