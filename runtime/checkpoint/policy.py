"""When to save and where to start: pure functions of the step, the clock, the checkpoint spec and
whether this run is a restart.

Steps count completed training steps (a checkpoint "of step 20" holds the state after 20
updates). The step interval is on the step number itself (20, 40, 60...), not on the distance
from the last save, so a time- or preemption-triggered save in between does not shift it and
a resumed run saves at the same steps as one that never stopped.
"""

from enum import Enum

from kuberl.api.spec import CheckpointSpec


class Start(Enum):
    """Where a run starts."""

    FRESH = "fresh"  # from step 0
    RESUME = "resume"  # from the latest committed checkpoint
    REFUSE = "refuse"  # not at all: starting fresh would overwrite saved work


def start_from(has_checkpoint: bool, spec: CheckpointSpec, restart: bool) -> Start:
    """Where a run starts, given whether its checkpoint location holds a committed checkpoint.

    `restart` (`--resume`, which the operator passes to every RayJob after a job's first) marks a restart
    of the same run: it resumes whatever spec.checkpoint.resume says, so `resume: false` starts fresh once
    and still survives preemption. Otherwise `resume: true` resumes when there is something to resume, and
    `resume: false` starts fresh, refusing a location that already holds checkpoints (saved work is never
    deleted to make room).
    """
    if not has_checkpoint:
        return Start.FRESH
    if restart or spec.resume:
        return Start.RESUME
    return Start.REFUSE


def should_save(
    step: int,
    last_saved_step: int | None,
    last_saved_time: float,
    now: float,
    spec: CheckpointSpec,
    final: bool = False,
    preempted: bool = False,
) -> bool:
    """Whether to checkpoint now, after `step` completed steps.

    `last_saved_time` and `now` are seconds on one clock (time.monotonic()); at start, pass the
    start time and the resumed step (or None). Nothing is saved twice for one step, nor before the
    first step. A preemption saves when spec.saveOnPreemption says so, the last step always saves
    (the export reads it), and otherwise every intervalSteps steps and every intervalMinutes minutes.
    """
    if step < 1 or (last_saved_step is not None and step <= last_saved_step):
        return False
    if preempted:
        return spec.save_on_preemption
    if final:
        return True
    if spec.interval_steps is not None and step % spec.interval_steps == 0:
        return True
    return spec.interval_minutes is not None and now - last_saved_time >= spec.interval_minutes * 60.0
