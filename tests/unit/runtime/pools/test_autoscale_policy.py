"""The elastic pools' scaling decision (reward workers and separate rollout replicas alike): a table of what a
pool observes and the size it moves to."""

import pytest

from kuberl.api.resources import RoleResources
from kuberl.api.topology import reward_group, rollout_group
from kuberl.runtime.pools.autoscale import PoolBounds, ScalePolicy, decide_pool_size

POLICY = ScalePolicy(target_wait_s=1.0, idle_release_s=10.0)


@pytest.mark.parametrize(
    ("current", "queue_len", "oldest_wait_s", "idle_seconds", "starting", "bounds", "expected"),
    [
        # steady: nothing queued, nobody idle long enough
        (2, 0, 0.0, [3.0], 0, (1, 4), 2),
        # a worker died below the minimum: topped up even with nothing queued
        (0, 0, 0.0, [], 0, (1, 4), 1),
        # maxReplicas is a ceiling whatever the pool holds
        (5, 0, 0.0, [], 0, (1, 4), 4),
        # queued, but no batch has waited past the 1.0 s target: keep
        (1, 10, 0.5, [], 0, (1, 4), 1),
        # waiting exactly the target is not waiting past it
        (1, 10, 1.0, [], 0, (1, 4), 1),
        # 2 batches waited past the target: 1 + 2 workers
        (1, 2, 1.5, [], 0, (1, 4), 3),
        # 10 batches: as many workers as the queue can use, but never above max 4
        (1, 10, 1.5, [], 0, (1, 4), 4),
        # 2 queued, 2 workers already starting for them: ask for none again
        (3, 2, 1.5, [], 2, (1, 8), 3),
        # 3 queued, 1 starting: 2 more, 3 + 2 = 5
        (3, 3, 1.5, [], 1, (1, 8), 5),
        # an empty pool (minReplicas 0) grows at once: nobody could take the batch however long it waits
        (0, 1, 0.0, [], 0, (0, 4), 1),
        # nothing queued: the two workers idle >= 10 s go, 4 - 2 = 2
        (4, 0, 0.0, [12.0, 10.0, 3.0], 0, (1, 4), 2),
        # ... but never below minReplicas 2
        (3, 0, 0.0, [20.0, 20.0, 20.0], 0, (2, 4), 2),
        # minReplicas 0: an idle pool goes away entirely
        (1, 0, 0.0, [30.0], 0, (0, 4), 0),
        # work is queued: an idle worker is about to get it, so nothing is released
        (3, 1, 0.1, [20.0], 0, (1, 4), 3),
    ],
)
def test_decide_pool_size(
    current: int,
    queue_len: int,
    oldest_wait_s: float,
    idle_seconds: list[float],
    starting: int,
    bounds: tuple[int, int],
    expected: int,
) -> None:
    size = decide_pool_size(
        current, queue_len, oldest_wait_s, idle_seconds, PoolBounds(*bounds), POLICY, starting=starting
    )
    assert size == expected


def test_growth_is_limited_to_max_step_up_at_a_time() -> None:
    careful = ScalePolicy(target_wait_s=1.0, max_step_up=1)
    # 10 batches waited 2 s: the queue could use 10 more workers; one at a time is 1 + 1 = 2
    assert decide_pool_size(1, 10, 2.0, [], PoolBounds(1, 8), careful) == 2


def test_endpoint_workers_with_several_slots_need_fewer_new_workers() -> None:
    # 6 batches queued, 4 in flight per worker: ceil(6 / 4) = 2 more workers, 1 + 2 = 3
    assert decide_pool_size(1, 6, 2.0, [], PoolBounds(1, 8), POLICY, slots_per_worker=4) == 3


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, PoolBounds(1, 1)),  # no spec.resources.reward: one worker beside the controller
        (RoleResources(replicas=3), PoolBounds(3, 3)),  # not elastic: min = max = replicas
        (RoleResources(replicas=2, minReplicas=1, maxReplicas=6), PoolBounds(1, 6)),
        (RoleResources(replicas=1, minReplicas=0, maxReplicas=2), PoolBounds(0, 2)),
    ],
)
def test_bounds_come_from_the_reward_resources(resources: RoleResources | None, expected: PoolBounds) -> None:
    assert PoolBounds.of(reward_group(resources)) == expected


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (RoleResources(replicas=2), PoolBounds(2, 2, "rollout")),  # a fixed pool: min = max = replicas
        (RoleResources(replicas=2, minReplicas=1, maxReplicas=4), PoolBounds(1, 4, "rollout")),
    ],
)
def test_the_separate_rollout_pool_moves_between_its_own_bounds(resources: RoleResources, expected: PoolBounds) -> None:
    assert PoolBounds.of(rollout_group(resources)) == expected


def test_impossible_bounds_name_the_pools_resources() -> None:
    with pytest.raises(ValueError, match=r"spec\.resources\.rollout"):
        PoolBounds(2, 1, "rollout")


@pytest.mark.parametrize(("low", "high"), [(3, 2), (0, 0), (-1, 2)])
def test_impossible_bounds_are_refused_naming_the_fields(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="minReplicas <= maxReplicas"):
        PoolBounds(low, high)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"target_wait_s": -1.0}, "target_wait_s"),
        ({"idle_release_s": 0.0}, "idle_release_s"),
        ({"max_step_up": 0}, "max_step_up"),
        ({"max_batch_attempts": 0}, "max_batch_attempts"),
    ],
)
def test_policy_refuses_nonsense_naming_the_field(changes: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ScalePolicy(**changes)
