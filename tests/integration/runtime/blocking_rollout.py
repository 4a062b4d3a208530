"""A rollout worker whose replica 1 never finishes a generation: it blocks until the test kills it.

Everything else is the real RolloutWorker with its real engine (setup, weight loads, and the generations of
every other replica), so a test kills a replica in the middle of a generation on purpose, not by timing
luck: it waits until the pool reports replica 1 generating, then `ray.kill`s it.
"""

import threading

from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.workers.rollout_worker import RolloutWorker

BLOCKED_REPLICA = 1


class BlockingFirstReplica(RolloutWorker):
    def generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[list[Generation]]:
        if self.rank == BLOCKED_REPLICA:
            threading.Event().wait()  # until ray.kill ends the process
        return super().generate(prompts, params, version)
