"""Rollout workers for pool tests: the real RolloutWorker with its real engine, plus one thing to observe.

`BlockingFirstReplica`: replica 1 never finishes a generation; it blocks until the test kills it, so a test
kills a replica in the middle of a generation on purpose, not by timing luck: it waits until the pool
reports replica 1 generating, then `ray.kill`s it.

`StopRecordingReplica`: its shutdown also tells a `StopLog` actor (named STOP_LOG) its replica number, so a
test sees which replicas the pool stopped before it killed them.

`HangingStopReplica`: its shutdown never returns, as an engine's teardown that hangs would not.
"""

import threading

import ray

from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.workers.rollout_worker import RolloutWorker

BLOCKED_REPLICA = 1


class BlockingFirstReplica(RolloutWorker):
    def generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[list[Generation]]:
        if self.rank == BLOCKED_REPLICA:
            threading.Event().wait()  # until ray.kill ends the process
        return super().generate(prompts, params, version)


STOP_LOG = "kuberl-test-stop-log"


@ray.remote(num_cpus=0)
class StopLog:
    def __init__(self) -> None:
        self.numbers: list[int] = []

    def add(self, number: int) -> None:
        self.numbers.append(number)

    def stopped(self) -> list[int]:
        return list(self.numbers)


class StopRecordingReplica(RolloutWorker):
    def shutdown(self) -> None:
        super().shutdown()
        ray.get(ray.get_actor(STOP_LOG).add.remote(self.rank))


class HangingStopReplica(RolloutWorker):
    def shutdown(self) -> None:
        threading.Event().wait()  # until the pool gives up on the stop and kills the actor
