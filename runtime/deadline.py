"""The wall-clock budget of one training step (spec.training.stepTimeoutSeconds) and the waits it bounds.

    with step_deadline(step=5, seconds=3600):
        groups.actor.call("update_actor", ...)   # waits at most the step's time left

The controller opens one deadline per step. Every wait of the step goes through `bounded_get` (Ray
calls of a WorkerGroup, the rollout's generations) or `time_left` (RewardPool.score), which give up
when the step's time is up and raise StepTimeoutError naming what they were waiting for: a hung
collective, an engine that never answers, a reward that never returns. The job then fails with that
reason and the operator restarts it from the latest checkpoint, instead of the job hanging forever.

A context variable carries the deadline, so the stages take no extra argument; outside a step
(start-up, checkpoints, the export) there is none and the waits are unbounded as before.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from kuberl.runtime.health import JobFailed, RunStopped


class StepTimeoutError(JobFailed):
    """A training step ran past spec.training.stepTimeoutSeconds."""


@dataclass(frozen=True)
class StepDeadline:
    step: int  # 1-based, as in metrics.jsonl
    seconds: float
    at: float  # time.monotonic() when the step's time is up

    def time_left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def exceeded(self, waiting_for: str) -> StepTimeoutError:
        return StepTimeoutError(
            f"step {self.step} did not finish within spec.training.stepTimeoutSeconds ({self.seconds:g} s): "
            f"still waiting for {waiting_for}"
        )


_current: ContextVar[StepDeadline | None] = ContextVar("kuberl_step_deadline", default=None)


@contextmanager
def step_deadline(step: int, seconds: float) -> Iterator[StepDeadline]:
    deadline = StepDeadline(step, seconds, time.monotonic() + seconds)
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


def current_deadline() -> StepDeadline | None:
    return _current.get()


class WorkerLost(RunStopped):
    """An actor died in the middle of a call: its process, or the pod it ran on, is gone. Not the job's failure:
    the run stops resumable (contract.ExitCode.RESUMABLE), and the restart resumes from the latest commit."""


def bounded_get(refs: Any, waiting_for: str) -> Any:
    """ray.get(refs), bounded by the current step's deadline (if any); a dead actor is a WorkerLost.

    Ray returns from a get as soon as one ref fails, even while the other ranks wait for the dead one
    inside a collective. A dead actor (its process, or the pod it ran on, is gone) becomes a WorkerLost that
    names the worker: the run exits resumable naming its latest checkpoint, and the restart resumes from that
    commit (a save the lost rank was writing never got its commit marker, so it is never adopted). Nothing of
    the step in progress can be saved then: each rank holds only its shard of the weights and optimiser
    state, and the lost rank's went with it. (A pod that is asked to stop is another matter: Ray drains its
    node first, and the driver saves the step before the node goes, checkpoint/preemption.py DrainWatcher.)
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = _current.get()
    try:
        return ray.get(refs, timeout=None if deadline is None else deadline.time_left())
    except GetTimeoutError:
        assert deadline is not None
        raise deadline.exceeded(waiting_for) from None
    except RayActorError as error:
        raise WorkerLost(
            f"{waiting_for}: {_dead_worker(refs)}'s actor died ({type(error).__name__}); its process or pod is "
            "gone, and with it its shard of the step in progress, which no save can recover: the run stops "
            "here, resumable, and a restart resumes from the latest checkpoint"
        ) from error


def _dead_worker(refs: Any) -> str:
    """'worker <i>': the first of `refs` (in rank order) whose actor is dead, for the message."""
    import ray
    from ray.exceptions import RayActorError

    for position, ref in enumerate(refs if isinstance(refs, list) else [refs]):
        if ray.wait([ref], timeout=0)[0]:
            try:
                ray.get(ref)
            except RayActorError:
                return f"worker {position}"
            except Exception:  # noqa: BLE001 - another rank's own failure is not the one named here
                continue
    return "a worker"
