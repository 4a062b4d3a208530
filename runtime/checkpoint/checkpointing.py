"""The driver's side of checkpoint-resume: where a run starts, when it saves, the commit, the export.

checkpointing = Checkpointing(job, output_dir, uid)
ref = checkpointing.start_point(restart)       # before any actor exists: a refusal costs nothing
step = checkpointing.begin(groups, ref)        # every trainer loads `ref`; the step to start from
checkpointing.resumed_state                    # the driver's own part of the train state it saved (run health)
checkpointing.after_step(step, epoch, final=..., preempted=..., state=...)  # each rank writes its shards, the commit
checkpointing.export(destination)              # the latest checkpoint's actor as a Hugging Face folder

Whose checkpoints. A location belongs to one RLJob, recorded before its first save (store.py `owner.json`):
its namespace, name and, on Kubernetes, its uid (the operator hands it over, contract.JOB_UID_ENV). A job
deleted and created again under the same name has another uid: it is another job, and is refused the earlier
one's checkpoints with a message saying how to start over or to take them over on purpose. Where a uid is
unknown on either side (`kuberl run`; checkpoints an older kuberl wrote, which have no record: their latest
job.yaml names the job) namespace and name decide. A run that resumes is also held to the spec its checkpoint
was written under (api/specdiff.py `resume_problems`, the operator's own rules for a running job's spec
change): a different actor model or algorithm never continues another's weights. Nothing at a location is
changed until it is known to be this job's: then it is claimed, and what this job's crashed saves left is
removed.
"""

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from kuberl.api import ManifestError, RLJob, parse_rljob
from kuberl.api.specdiff import resume_problems
from kuberl.runtime.checkpoint.locations import checkpoint_uri, job_folder_on_claim
from kuberl.runtime.checkpoint.policy import Start, should_save, start_from
from kuberl.runtime.checkpoint.preemption import PreemptionWatcher
from kuberl.runtime.checkpoint.store import JOB_MANIFEST, OWNER, CheckpointRef, CheckpointStore

log = logging.getLogger(__name__)


class CheckpointLocationError(ValueError):
    """The job cannot use its checkpoint location (another job's, or saved work it was told not to resume);
    the message names the field and what to do."""


@dataclass(frozen=True)
class JobIdentity:
    """Which RLJob a run is, or wrote a checkpoint location: namespace and name, and its uid when known."""

    namespace: str | None
    name: str | None
    uid: str | None = None  # metadata.uid on Kubernetes; None for `kuberl run` and for an older kuberl's checkpoints

    @property
    def path(self) -> str:
        return "/".join(part for part in (self.namespace, self.name) if part) or "an unnamed job"

    def is_same_job(self, other: "JobIdentity") -> bool:
        """Same namespace and name, and the same uid unless one side does not know it."""
        if (self.namespace, self.name) != (other.namespace, other.name):
            return False
        return self.uid is None or other.uid is None or self.uid == other.uid


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

    def __init__(self, job: RLJob, output_dir: Path, uid: str | None = None) -> None:
        self.job = job
        self.identity = JobIdentity(job.metadata.namespace, job.metadata.name, uid)
        self.spec = job.spec.checkpoint
        self.store = CheckpointStore(checkpoint_uri(job, output_dir), self.spec.keep_last)
        self.groups: TrainerGroups | None = None
        self.last_step: int | None = None
        self.last_time = time.monotonic()
        self.latest: CheckpointRef | None = None
        self.last_save_seconds: float | None = None  # how long the last save took, for the stop window's outlook
        self.resumed_state: dict[str, Any] = {}  # the train state of the checkpoint resumed from ({}: fresh)

    def start_point(self, restart: bool) -> CheckpointRef | None:
        """The checkpoint the run resumes from, None to start fresh; refuses another job's location, saved work
        it was told not to resume, and a checkpoint its spec cannot resume. Only then is the location claimed
        and cleaned of this job's crashed saves."""
        ref = self.store.latest()
        self.refuse_another_jobs(ref)
        start = start_from(ref is not None, self.spec, restart)
        if start == Start.REFUSE:
            assert ref is not None
            raise CheckpointLocationError(
                f"spec.checkpoint.resume is false, but {self.store.uri} holds checkpoints up to step {ref.step}; "
                "point spec.checkpoint.uri (or --output) at an empty location, remove them, or pass --resume "
                "to carry on from them"
            )
        if start == Start.RESUME:
            assert ref is not None
            self.refuse_a_spec_that_cannot_resume(ref)
        self.store.claim(asdict(self.claimant()))
        self.store.remove_unfinished()
        return ref if start == Start.RESUME else None

    def owner(self, ref: CheckpointRef | None) -> JobIdentity | None:
        """The RLJob the location belongs to: its record, else (an older kuberl's checkpoints) the job that
        committed the latest checkpoint; None for a location no job has saved into."""
        record = self.store.owner()
        if record is not None:
            return JobIdentity(**record)
        if ref is not None:
            return JobIdentity(*self.store.job_of(ref))
        return None

    def claimant(self) -> JobIdentity:
        """What this job records as the location's owner: itself, keeping a uid it does not know but the record
        does (a `kuberl run` over a cluster job's folder)."""
        known = self.store.owner()
        uid = self.identity.uid or (known or {}).get("uid")
        return JobIdentity(self.identity.namespace, self.identity.name, uid)

    def refuse_another_jobs(self, ref: CheckpointRef | None) -> None:
        """A location holding another RLJob's checkpoints (or save in progress) is not resumed from, nor saved into,
        nor cleaned: nothing there is touched."""
        theirs, mine = self.owner(ref), self.identity
        if theirs is None or theirs.is_same_job(mine):
            return
        held = f"up to step {ref.step}" if ref is not None else "none committed yet: a save may be under way"
        if theirs.path != mine.path:
            raise CheckpointLocationError(
                f"{self.store.uri} holds the checkpoints of RLJob {theirs.path} ({held}), not of this job "
                f"({mine.path}); give this job a location of its own (spec.checkpoint.uri, or --output)"
            )
        raise CheckpointLocationError(
            f"{self.store.uri} holds the checkpoints of an earlier RLJob {theirs.path} (uid {theirs.uid}, {held}), "
            f"deleted since: this RLJob (uid {mine.uid}) has its name but is another job, and does not resume "
            f"another job's run. To start over, {self.fresh_start()}. To carry on from those checkpoints on "
            f"purpose, remove {self.store.root.child(OWNER).uri} (the record of the job that wrote them): the "
            "next start takes them over, if this job's spec can resume them"
        )

    def refuse_a_spec_that_cannot_resume(self, ref: CheckpointRef) -> None:
        """The checkpoint was written under a spec whose state this job's cannot take (api/specdiff.py)."""
        where = f"{ref.uri}/{JOB_MANIFEST}"
        try:
            saved = parse_rljob(self.store.manifest_of(ref), where).spec
        except ManifestError as error:
            raise CheckpointLocationError(
                f"the spec the checkpoint of step {ref.step} was written under cannot be read by this kuberl, so "
                f"whether this job may resume it is unknown: {error}. To start over, {self.fresh_start()}"
            ) from None
        problems = resume_problems(saved, self.job.spec)
        if problems:
            raise CheckpointLocationError(
                f"{self.store.uri} holds checkpoints up to step {ref.step} that this job's spec cannot resume: "
                f"{'; '.join(problems)}. To start over, {self.fresh_start()}"
            )

    def fresh_start(self) -> str:
        """How a job refused a location starts over, keeping what is there."""
        if self.job.spec.checkpoint.uri:
            return f"point spec.checkpoint.uri at an empty location, or remove {self.store.uri}"
        if self.job.spec.checkpoint.pvc_claim_name:
            folder = job_folder_on_claim(self.job)
            return f"give this job another name, or remove {folder} (the checkpoints, exported model and metrics there)"
        return f"run it with another --output, or remove {self.store.uri}"

    def begin(self, groups: TrainerGroups, ref: CheckpointRef | None) -> int:
        """Load `ref` into every trainer of `groups`; the step to start from (0: fresh)."""
        self.groups = groups
        if ref is None:
            return 0
        for group in groups.trainers:
            group.call("load_checkpoint", ref.uri)
        state = self.store.load_train_state(ref)
        self.resumed_state = state
        self.last_step, self.latest = int(state["step"]), ref
        log.info("resumed from the checkpoint of step %d: %s", self.last_step, ref.uri)
        return self.last_step

    def after_step(
        self,
        step: int,
        epoch: int,
        *,
        final: bool,
        preempted: bool,
        stopping: PreemptionWatcher | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        """Saves after `step` when due; `state` is the driver's own to keep with it (`resumed_state` on resume)."""
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
        train_state = {**(state or {}), "step": done, "epoch": epoch}
        self.latest = self.store.commit(location, done, train_state, self.job.to_manifest())
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
