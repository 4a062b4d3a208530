"""The driver's side of checkpoint-resume: where a run starts, when it saves, the commit, the export.

checkpointing = Checkpointing(job, output_dir)
ref = checkpointing.start_point(restart)       # before any actor exists: a refusal costs nothing
step = checkpointing.begin(groups, ref)        # every trainer loads `ref`; the step to start from
checkpointing.after_step(step, epoch, final=..., preempted=...)   # each rank writes its shards, then the commit
checkpointing.export(destination)              # the latest checkpoint's actor as a Hugging Face folder
"""

import logging
import time
from pathlib import Path
from typing import Any, Protocol

from kuberl.api import RLJob
from kuberl.runtime.checkpoint.locations import checkpoint_uri
from kuberl.runtime.checkpoint.policy import Start, should_save, start_from
from kuberl.runtime.checkpoint.preemption import PreemptionWatcher
from kuberl.runtime.checkpoint.store import CheckpointRef, CheckpointStore

log = logging.getLogger(__name__)


class CheckpointLocationError(ValueError):
    """The job cannot use its checkpoint location (another job's, or saved work it was told not to resume);
    the message names the field and what to do."""


class TrainerGroups(Protocol):
    """The worker groups a checkpoint covers (pools/launch.py Groups): every trainer group, and the actor's."""

    @property
    def trainers(self) -> list[Any]: ...

    @property
    def actor(self) -> Any: ...


class Checkpointing:
    """The driver's side of checkpoint-resume: where to start, when to save, the commit, the export.

    `start_point` decides before any actor exists (a refusal costs nothing); `begin` loads the chosen
    checkpoint into the trainers once the groups are up.
    """

    def __init__(self, job: RLJob, output_dir: Path) -> None:
        self.job = job
        self.spec = job.spec.checkpoint
        self.store = CheckpointStore(checkpoint_uri(job, output_dir), self.spec.keep_last)
        self.groups: TrainerGroups | None = None
        self.last_step: int | None = None
        self.last_time = time.monotonic()
        self.latest: CheckpointRef | None = None
        self.last_save_seconds: float | None = None  # how long the last save took, for the stop window's outlook

    def start_point(self, restart: bool) -> CheckpointRef | None:
        """The checkpoint the run resumes from, None to start fresh; refuses to start over saved work."""
        ref = self.store.latest()
        if ref is not None:
            self.refuse_another_jobs(ref)
        start = start_from(ref is not None, self.spec, restart)
        if start == Start.REFUSE:
            assert ref is not None
            raise CheckpointLocationError(
                f"spec.checkpoint.resume is false, but {self.store.uri} holds checkpoints up to step {ref.step}; "
                "point spec.checkpoint.uri (or --output) at an empty location, remove them, or pass --resume "
                "to carry on from them"
            )
        return ref if start == Start.RESUME else None

    def refuse_another_jobs(self, ref: CheckpointRef) -> None:
        """A location holding another RLJob's checkpoints is not resumed from, nor saved into."""
        theirs = self.store.job_of(ref)
        mine = (self.job.metadata.namespace, self.job.metadata.name)
        if theirs != mine:
            owner = "/".join(part for part in theirs if part) or "an unnamed job"
            raise CheckpointLocationError(
                f"{self.store.uri} holds the checkpoints of RLJob {owner} (up to step {ref.step}), not of this "
                f"job ({'/'.join(part for part in mine if part)}); give this job a location of its own "
                "(spec.checkpoint.uri, or --output)"
            )

    def begin(self, groups: TrainerGroups, ref: CheckpointRef | None) -> int:
        """Load `ref` into every trainer of `groups`; the step to start from (0: fresh)."""
        self.groups = groups
        if ref is None:
            return 0
        for group in groups.trainers:
            group.call("load_checkpoint", ref.uri)
        state = self.store.load_train_state(ref)
        self.last_step, self.latest = int(state["step"]), ref
        log.info("resumed from the checkpoint of step %d: %s", self.last_step, ref.uri)
        return self.last_step

    def after_step(
        self, step: int, epoch: int, *, final: bool, preempted: bool, stopping: PreemptionWatcher | None = None
    ) -> None:
        done = step + 1
        if not should_save(done, self.last_step, self.last_time, time.monotonic(), self.spec, final, preempted):
            return
        if preempted and stopping is not None:
            stopping.warn_if_the_save_may_not_fit(self.last_save_seconds, self.last_step)
        started = time.monotonic()
        location = self.store.begin(done)
        assert self.groups is not None
        for group in self.groups.trainers:  # each group's ranks write their own models' shards
            group.call("save_checkpoint", location)
        self.latest = self.store.commit(location, done, {"step": done, "epoch": epoch}, self.job.to_manifest())
        self.last_step, self.last_time = done, time.monotonic()
        self.last_save_seconds = self.last_time - started

    def export(self, destination: str) -> str | None:
        """The latest checkpoint's actor as a Hugging Face folder at `destination`, a path or an object-store
        URI (the last step always saves, so it is final); where it is, None without a checkpoint."""
        if self.latest is None or self.groups is None:
            return None
        exported: str = self.groups.actor.call("export_hf", self.latest.uri, destination)[0]
        log.info("exported the final model (step %d) as a Hugging Face model: %s", self.latest.step, exported)
        return exported
