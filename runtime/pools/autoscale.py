"""When an elastic pool grows and shrinks: a pure function of what the pool observes.

`decide_pool_size` is the whole policy of both elastic pools: the reward workers (`RewardPool`,
rewards/pool.py; its queue holds reward batches) and the separate rollout replicas (`RolloutPool`,
rollout_pool.py; its queue holds the chunks of prompts waiting for generation). Each pool measures,
calls it every `ScalePolicy.interval_s` and applies the answer by starting or releasing Ray actors.
The rules, in order:

1. Bounds: the size never leaves [minReplicas, maxReplicas]. A pool below its minimum (a worker
   died) is topped up even with nothing queued.
2. Grow: batches are queued and either no worker exists at all, or the oldest queued batch has
   waited longer than `target_wait_s`. The pool adds the workers the queue could use at once,
   ceil(queued batches / slots per worker), minus the workers already starting (so a worker that
   takes a minute to be scheduled is not asked for again every tick), at most `max_step_up` at a
   time.
3. Shrink: nothing is queued; every worker idle for at least `idle_release_s` is released, down
   to minReplicas. Busy workers are never released.
4. Otherwise the size stays.

Growing on queue *wait* rather than queue *length* keeps a pool whose workers clear the queue
quickly from growing on every burst; the KubeRay autoscaler then adds a pod for each worker
that asks for the pool's resource (`kuberl_reward`, `kuberl_rollout`) and removes pods once released
workers leave them idle.
"""

import math
from dataclasses import dataclass

from kuberl.api.topology import ActorGroup


@dataclass(frozen=True)
class ScalePolicy:
    """How eagerly a pool grows and how long an idle worker is kept."""

    target_wait_s: float = 2.0  # grow when the oldest queued batch has waited longer than this
    idle_release_s: float = 60.0  # release a worker idle this long (KubeRay's default idleTimeoutSeconds)
    max_step_up: int | None = None  # most workers added at once; None: as many as the queue can use
    interval_s: float = 0.05  # how often the pool looks at its queue
    max_batch_attempts: int = 3  # a batch whose worker died this many times fails (its samples, or the rollout)
    start_timeout_s: float = 900.0  # the first workers must be ready within this (image pulls on Kubernetes)

    def __post_init__(self) -> None:
        if self.target_wait_s < 0:
            raise ValueError(f"ScalePolicy.target_wait_s is {self.target_wait_s}; use 0 or more seconds")
        if self.idle_release_s <= 0 or self.interval_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError("ScalePolicy.idle_release_s, interval_s and start_timeout_s must be positive seconds")
        if self.max_step_up is not None and self.max_step_up < 1:
            raise ValueError(f"ScalePolicy.max_step_up is {self.max_step_up}; use 1 or more, or None for no limit")
        if self.max_batch_attempts < 1:
            raise ValueError(f"ScalePolicy.max_batch_attempts is {self.max_batch_attempts}; use 1 or more")


@dataclass(frozen=True)
class ScaleEvent:
    """One change of a pool's size."""

    at_s: float  # seconds since the pool started
    before: int
    after: int
    reason: str


@dataclass(frozen=True)
class PoolBounds:
    """The fewest and most workers of a pool: spec.resources.<pool>.minReplicas / maxReplicas."""

    min_size: int
    max_size: int
    pool: str = "reward"  # the role whose spec.resources entry sets the bounds

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1:
            raise ValueError(
                f"{self.pool} pool bounds [{self.min_size}, {self.max_size}]: need 0 <= minReplicas <= maxReplicas "
                f"and maxReplicas >= 1 (spec.resources.{self.pool})"
            )

    @classmethod
    def of(cls, group: ActorGroup) -> "PoolBounds":
        """A group's bounds: spec.resources.<role>'s min/maxReplicas (the reward group without a pool: one worker)."""
        return cls(group.min_actors, group.max_actors, str(group.name))


def decide_pool_size(
    current: int,
    queue_len: int,
    oldest_wait_s: float,
    idle_seconds: list[float],
    bounds: PoolBounds,
    policy: ScalePolicy,
    *,
    starting: int = 0,
    slots_per_worker: int = 1,
) -> int:
    """The pool size to move to.

    current: workers alive or starting; queue_len: batches waiting for a worker; oldest_wait_s: how
    long the oldest of them has waited; idle_seconds: for each ready worker with nothing to do, how
    long it has had nothing to do; starting: workers asked for but not ready yet (part of current);
    slots_per_worker: batches one worker runs at once (an endpoint worker's maxConcurrency).
    """
    size = min(max(current, bounds.min_size), bounds.max_size)
    if queue_len > 0:
        if current == 0 or oldest_wait_s > policy.target_wait_s:
            wanted = math.ceil(queue_len / slots_per_worker) - starting
            if policy.max_step_up is not None:
                wanted = min(wanted, policy.max_step_up)
            size = max(size, min(current + wanted, bounds.max_size))
        return size
    releasable = sum(1 for seconds in idle_seconds if seconds >= policy.idle_release_s)
    return max(bounds.min_size, min(size, current - releasable))
