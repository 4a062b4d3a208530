"""A worker whose process dies (its pod evicted) fails the job naming it, even while the other ranks wait for it.

Real Ray actors: rank 0 blocks as a rank does inside a collective whose peer is gone (the stand-in for that
wait is a long sleep), rank 1's process exits. The failure is a JobFailed (the driver exits naming its latest
checkpoint, and the restart resumes from it), not Ray's ActorDiedError traceback.
"""

import os
import time

import pytest
import ray

from kuberl.runtime.deadline import StepTimeoutError, WorkerLost, bounded_get, step_deadline

pytestmark = pytest.mark.integration


@ray.remote(num_cpus=0.1)
class Rank:
    def wait_for_peer(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    def lose_the_pod(self) -> str:
        os._exit(1)

    def answer(self, value: int) -> int:
        return value


def test_a_dead_rank_ends_the_wait_at_once_naming_it(ray_session):
    waiting, dying = Rank.remote(), Rank.remote()
    try:
        with step_deadline(step=3, seconds=60), pytest.raises(WorkerLost) as lost:
            bounded_get(
                [waiting.wait_for_peer.remote(300), dying.lose_the_pod.remote()], "update_actor on the actor workers"
            )
        message = str(lost.value)
        assert "update_actor on the actor workers: worker 1's actor died" in message
        assert "resumes from the latest checkpoint" in message
    finally:
        ray.kill(waiting)


def test_results_keep_rank_order_and_the_deadline_still_bounds_the_wait(ray_session):
    ranks = [Rank.remote() for _ in range(3)]
    try:
        assert bounded_get([rank.answer.remote(i) for i, rank in enumerate(ranks)], "answers") == [0, 1, 2]
        assert bounded_get(ranks[0].answer.remote(7), "one answer") == 7
        with step_deadline(step=1, seconds=1), pytest.raises(StepTimeoutError, match="still waiting for a sleeper"):
            bounded_get([ranks[1].answer.remote(1), ranks[2].wait_for_peer.remote(300)], "a sleeper")
    finally:
        for rank in ranks:
            ray.kill(rank)
