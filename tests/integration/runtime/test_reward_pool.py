"""The elastic reward pool on a real local Ray: it grows under a burst, shrinks when idle, and scores
every sample exactly once even when a worker is killed mid-batch.

The reward sleeps 0.2 s per sample (slow_rewards.py), so the timings measure waiting, not the two
shared CPU cores, and scores each sample with its own index, so every result can be checked.
"""

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kuberl.api.resources import RoleResources
from kuberl.api.topology import ActorGroup, reward_group
from kuberl.runtime.pools.autoscale import ScalePolicy
from kuberl.runtime.pools.reward import RewardPool
from kuberl.runtime.rewards.functions import RewardConfigError, RewardResult
from tests.integration.runtime.test_reward_limits import within

pytestmark = pytest.mark.integration

SLOW_REWARD = {"function": "tests.integration.runtime.slow_rewards:slow_score", "batchSize": 2}
BURST = 48  # samples: 24 batches of 2, 0.4 s each -> 9.6 s on one worker, 2.4 s of work on four
POLICY = ScalePolicy(target_wait_s=0.2, idle_release_s=1.0)
CPUS = 0.2  # per worker: four fit beside the session's other actors


def burst(n: int = BURST) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    return [f"prompt {i}" for i in range(n)], [f"response {i}" for i in range(n)], [{"index": i} for i in range(n)]


def reward_pool(low: int, high: int) -> ActorGroup:
    """The reward group the topology makes of a reward pool of low..high workers."""
    return reward_group(RoleResources(replicas=low, minReplicas=low, maxReplicas=high, cpus=CPUS))


def assert_each_sample_scored_once_by_its_index(results: list[RewardResult], n: int = BURST) -> None:
    assert len(results) == n
    assert [result.error for result in results] == [None] * n
    assert [result.score for result in results] == [float(i) for i in range(n)]


def timed_score(pool: RewardPool) -> tuple[float, list[RewardResult]]:
    started = time.perf_counter()
    results = pool.score(*burst())
    return time.perf_counter() - started, results


@dataclass
class BurstRuns:
    min_replicas_s: float
    autoscaled_s: float
    min_results: list[RewardResult]
    autoscaled_results: list[RewardResult]
    autoscaled_metrics: dict[str, float]
    elastic: RewardPool  # the autoscaled pool, still running, for the shrink test


@pytest.fixture(scope="module")
def burst_runs(ray_session: Any) -> Iterator[BurstRuns]:
    """The same burst through a pool fixed at one worker and through a pool of 1..4 workers."""
    fixed = RewardPool(SLOW_REWARD, None, reward_pool(1, 1), policy=POLICY)
    try:
        min_s, min_results = timed_score(fixed)
    finally:
        fixed.shutdown()
    elastic = RewardPool(SLOW_REWARD, None, reward_pool(1, 4), policy=POLICY)
    try:
        auto_s, auto_results = timed_score(elastic)
        yield BurstRuns(min_s, auto_s, min_results, auto_results, elastic.metrics(), elastic)
    finally:
        elastic.shutdown()


def test_every_sample_gets_its_own_score_at_min_and_autoscaled(burst_runs: BurstRuns) -> None:
    assert_each_sample_scored_once_by_its_index(burst_runs.min_results)
    assert_each_sample_scored_once_by_its_index(burst_runs.autoscaled_results)


def test_pool_grows_to_max_replicas_during_a_burst(burst_runs: BurstRuns) -> None:
    metrics = burst_runs.autoscaled_metrics
    assert metrics["reward/pool_size_peak"] == 4
    assert metrics["reward/scale_ups"] >= 1
    assert metrics["reward/queue_wait_max_seconds"] > POLICY.target_wait_s  # the wait that made it grow


def test_one_worker_takes_the_whole_burst_in_turn(burst_runs: BurstRuns) -> None:
    # one worker: 24 batches * 0.4 s = 9.6 s at least. How much faster the elastic pool is depends on how fast
    # its new actors start (seconds of imports on a busy machine): bench/reward_pool.py measures that, not a test.
    assert burst_runs.min_replicas_s >= 9.6


def test_pool_shrinks_back_to_min_replicas_when_idle(burst_runs: BurstRuns) -> None:
    pool = burst_runs.elastic
    # the workers added for the burst may still be starting (about 20 s each with the machine's two cores busy);
    # each is released 1 s after it is ready with nothing to do
    deadline = time.monotonic() + 60
    while pool.size > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.size == 1
    assert pool.metrics()["reward/scale_downs"] >= 1
    assert pool.scale_events[-1].after == 1


def test_killing_a_worker_mid_batch_loses_and_duplicates_nothing(ray_session: Any) -> None:
    import ray

    pool = RewardPool(SLOW_REWARD, None, reward_pool(2, 2), policy=POLICY)
    killed: list[Any] = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 5
        while not killed and time.monotonic() < deadline:
            busy = pool.actors(busy=True)
            if busy:
                ray.kill(busy[0])
                killed.append(busy[0])
            time.sleep(0.05)

    try:
        killer = threading.Timer(0.6, kill_a_busy_worker)  # 12 batches on 2 workers: ~2.4 s of work
        killer.start()
        results = pool.score(*burst(24))
        killer.join()
        metrics = pool.metrics()
        assert killed
        assert_each_sample_scored_once_by_its_index(results, 24)
        assert metrics["reward/worker_deaths"] == 1
        assert metrics["reward/requeued_batches"] >= 1
    finally:
        pool.shutdown()


def test_a_batch_that_keeps_killing_its_worker_fails_its_samples_not_the_job(ray_session: Any) -> None:
    reward = {"function": "tests.integration.runtime.slow_rewards:kill_worker_on_index_3", "batchSize": 2}
    pool = RewardPool(reward, None, reward_pool(1, 1), policy=ScalePolicy(max_batch_attempts=2))
    try:
        results = pool.score(*burst(8))
        metrics = pool.metrics()
    finally:
        pool.shutdown()
    # batch [2, 3] killed a worker twice and gave up; batches [0, 1], [4, 5], [6, 7] scored normally
    assert [result.score for result in results] == [0.0, 1.0, 0.0, 0.0, 4.0, 5.0, 6.0, 7.0]
    assert [i for i, result in enumerate(results) if result.error is not None] == [2, 3]
    assert "gave up after 2 attempts" in (results[3].error or "")
    assert metrics["reward/worker_deaths"] == 2


def test_a_single_batch_that_fails_every_attempt_ends_the_score_call_with_its_samples_failed(
    ray_session: Any,
) -> None:
    # the call's only batch is its last pending one: nothing after it would end the call if giving up did not
    reward = {"function": "tests.integration.runtime.slow_rewards:kill_worker_on_index_3", "batchSize": 2}
    pool = RewardPool(reward, None, reward_pool(1, 1), policy=ScalePolicy(max_batch_attempts=2))
    try:
        results = within(90, lambda: pool.score(["prompt 3"], ["response 3"], [{"index": 3}]))  # no step deadline
        metrics = pool.metrics()
    finally:
        pool.shutdown()
    assert [result.score for result in results] == [0.0]
    assert "gave up after 2 attempts" in (results[0].error or "")
    assert metrics["reward/worker_deaths"] == 2


def test_a_reward_that_cannot_load_fails_the_pool_at_start(ray_session: Any) -> None:
    manifest = {"function": "tests.integration.runtime.slow_rewards:no_such_reward"}
    with pytest.raises(RewardConfigError, match="no attribute 'no_such_reward'"):
        RewardPool(manifest, None, reward_pool(1, 2), policy=POLICY)


class _IndexScoringService(BaseHTTPRequestHandler):
    """A reward service that scores each item by its sample's index and records batch sizes."""

    batch_sizes: list[int] = []

    def do_POST(self) -> None:
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        type(self).batch_sizes.append(len(items))
        time.sleep(0.05)
        body = json.dumps({"scores": [item["sample"]["index"] for item in items]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_endpoint_pool_scores_through_an_http_service_in_batches(ray_session: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _IndexScoringService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    manifest = {"endpoint": {"url": url, "maxConcurrency": 3, "timeoutSeconds": 5}, "batchSize": 4}
    pool = RewardPool(manifest, None, reward_pool(1, 1), policy=POLICY)
    try:
        results = pool.score(*burst(10))
        assert_each_sample_scored_once_by_its_index(results, 10)
        assert sorted(_IndexScoringService.batch_sizes) == [2, 4, 4]
    finally:
        pool.shutdown()
        server.shutdown()
        server.server_close()
