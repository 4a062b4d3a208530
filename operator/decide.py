"""The decision of one reconcile pass: a pure function from what was observed to what to do.

`decide(observed, now, settings)` reads the RLJob (spec and the status written so far), the
job's RayJobs, its spec ConfigMap and the runtime's report, and returns a `Decision`: the status,
the children to apply, the RayJobs to delete, the Events to post and when to look again. It
reads no clock and does no I/O, so every rule is a table test (tests/unit/operator/).

The pass is an explicit state machine, as in KubeRay. `_facts` reads what was observed into frozen
`Facts` (the stored status, the spec that runs, its RayJobs, the runtime's report, ...), once; `_rule`,
the switch, picks the first of these rules whose case holds, and the rule fills the pass's `Outcome` (the
new status, the children to apply, the RayJobs to delete, Events, when to look again). Every pass then
adds the deadline's next look, SpecChangeRefused, UnknownFields and the TTL's pass.

1. finished     Succeeded/Failed are final; only ttlSecondsAfterFinished acts (deletes the RLJob).
2. invalid      no valid spec to run (the webhook was bypassed): Pending, Created=False/InvalidSpec.
3. deadline     activeDeadlineSeconds passed since startTime, suspended time not counted: Failed/DeadlineExceeded.
4. suspend      runPolicy.suspend: every RayJob deleted (checkpoints stay), Suspended.
5. no KubeRay   the API server does not serve RayJobs: Created=False/KubeRayMissing, looked at again later.
6. name taken   a ConfigMap of the job's names is not the job's: Created=False/NameTaken; never adopted.
7. resume       suspend turned off: a new RayJob that resumes from the latest checkpoint.
8. first start  no RayJob named yet: `<rljob>-0`.
9. missing      the RayJob named in status does not exist (a crash after naming it, or the previous
                RayJob was still being deleted): create exactly it, once no other RayJob of the job exists.
10. follow      the RayJob's state decides: Queued, Starting, Running, Succeeded, Refused (KubeRay's validation:
                Failed, no restart), or Failed -> backoff -> a new RayJob `<rljob>-<n+1>` with --resume, until
                runPolicy.maxRestarts.

Kueue (spec.queueName): the RayJob is created suspended and Kueue alone moves its `suspend` after
that; the operator only reads it. While it is suspended the RLJob is Queued (condition Queued=True:
WaitingForAdmission before it first ran, Preempted after), once admitted Queued=False/Admitted. A
preemption is no restart: the same RayJob resumes from the latest checkpoint when Kueue admits it
again (KubeRay re-runs its entrypoint, and the runtime always resumes).

Created=True is set only once the RayJob is seen to exist; a child the API server refuses turns it
False with the API's message (`apply_failed`, written by the reconcile pass). A new RayJob is always
named in status before it is created (the status is applied first), and
the name comes from the name stored in status, so a pass that dies half-way is finished by the
next one and never duplicates a RayJob. A spec change (compared with the spec in the ConfigMap,
i.e. the one the RayJob runs) restarts the job from its checkpoint when safe (`api/specdiff.py`) and is
refused with SpecChangeRefused when not; the refused spec never reaches the ConfigMap. Fields the API
server dropped from the applied manifest (typos) are reported as UnknownFields=True (pruned.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kuberl.api import ManifestError, RLJob, parse_rljob
from kuberl.api.enums import TERMINAL_PHASES, ConditionReason, ConditionStatus, ConditionType, Phase
from kuberl.api.spec import RunPolicy
from kuberl.api.specdiff import runtime_spec_changed, unsafe_changes
from kuberl.api.status import RLJobStatus, RuntimeReport
from kuberl.operator import names
from kuberl.operator.access import build_access, build_progress_configmap
from kuberl.operator.builders import Owner, build_configmap, build_rayjob, configmap_spec, spec_manifest
from kuberl.operator.pruned import pruned_fields
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.status import (
    RayJobState,
    find_condition,
    flipped,
    is_true,
    rayjob_message,
    rayjob_state,
    read_report,
    read_status,
    status_manifest,
    to_the_second,
    with_condition,
    with_report,
    without_running,
)

#: The longest wait before a restart, however many restarts came before (runPolicy.backoffSeconds' own maximum).
MAX_BACKOFF_SECONDS = 86400
#: How soon to look again while a deleted RLJob's old RayJob still blocks a name.
FOREIGN_NAME_RETRY_SECONDS = 2.0
#: How soon to look again while the previous RayJob (its Ray cluster and pods) is still being deleted.
PREVIOUS_RAYJOB_RETRY_SECONDS = 2.0
#: How soon to look again while a ConfigMap of the job's name is someone else's.
NAME_TAKEN_RETRY_SECONDS = 30.0
#: How soon to look again while the API server does not know RayJobs.
KUBERAY_RETRY_SECONDS = 30.0
KUBERAY_MISSING = (
    "the API server does not know RayJobs (ray.io/v1): install KubeRay (its CRDs rayjobs.ray.io and "
    "rayclusters.ray.io) in this cluster, then the operator creates the job's RayJob on its next pass"
)
#: Condition flips that deserve a Warning event rather than a Normal one.
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
WARNINGS = {
    (ConditionType.FAILED, TRUE),
    (ConditionType.SPEC_CHANGE_REFUSED, TRUE),
    (ConditionType.RESTARTING, TRUE),
    (ConditionType.CREATED, FALSE),
    (ConditionType.UNKNOWN_FIELDS, TRUE),
}


@dataclass(frozen=True)
class Observed:
    """What one pass read: the RLJob, the RayJobs labelled with its name, and its spec ConfigMap."""

    rljob: dict[str, Any]
    rayjobs: tuple[dict[str, Any], ...] = ()
    configmap: dict[str, Any] | None = None
    kuberay_missing: bool = False  # the API server does not serve RayJobs (404 on the list)
    progress: dict[str, Any] | None = None  # the ConfigMap the runtime reports into (access.py)

    def foreign_configmaps(self) -> list[str]:
        """The job's ConfigMap names held by ConfigMaps that are not the job's (never read, applied or adopted)."""
        uid = self.rljob["metadata"]["uid"]
        found = (self.configmap, self.progress)
        return [cm["metadata"]["name"] for cm in found if cm is not None and not owned_by(cm, uid)]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: RLJobStatus
    write_status: bool
    apply: tuple[dict[str, Any], ...] = ()  # in order: the ConfigMap before the RayJob that mounts it
    delete_rayjobs: tuple[str, ...] = ()
    delete_rljob: bool = False
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None


def backoff_seconds(base: int, restarts: int) -> float:
    """The wait before restart number restarts+1: base, 2*base, 4*base ... at most MAX_BACKOFF_SECONDS."""
    return float(min(base * 2 ** min(restarts, 32), MAX_BACKOFF_SECONDS))


def later(moment: datetime, seconds: float) -> datetime:
    """`moment` plus `seconds`, or the last representable moment: a time near year 9999 in a status never
    makes a pass raise OverflowError (it would fail on every pass, forever)."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=moment.tzinfo)


def owned_by(child: dict[str, Any], uid: str) -> bool:
    refs = child.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def _parse(name: str, namespace: str, spec: dict[str, Any] | None) -> tuple[RLJob | None, list[str]]:
    if spec is None:
        return None, []
    try:
        return parse_rljob(spec_manifest(name, namespace, spec), f"RLJob {namespace}/{name}"), []
    except ManifestError as error:
        return None, [str(problem) for problem in error.problems]


def _run_policy(raw: dict[str, Any], parsed: RLJob | None) -> RunPolicy:
    """runPolicy as written when it is valid on its own (suspend works even beside a broken field elsewhere)."""
    try:
        return RunPolicy.model_validate(raw.get("runPolicy") or {})
    except ValueError:
        return parsed.spec.run_policy if parsed is not None else RunPolicy()


@dataclass(frozen=True)
class Facts:
    """What one pass observed and parsed, computed once (`_facts`): the rules read it and change nothing in it."""

    now: datetime
    settings: OperatorSettings
    owner: Owner
    generation: int
    before: RLJobStatus  # the status as stored; the outcome starts from a copy of it
    policy: RunPolicy
    run_spec: dict[str, Any] | None  # the raw spec a RayJob created now would run
    run_job: RLJob | None
    refusal: tuple[ConditionReason, str] | None  # why the desired spec is not the one that runs
    safe_change: bool  # the desired spec differs from the running one and may replace it
    current: dict[str, Any] | None  # the RayJob named in status, when it exists and is ours
    mine: tuple[dict[str, Any], ...]  # the job's RayJobs
    foreign: frozenset[str]  # names held by RayJobs of another owner (a deleted RLJob of the same name)
    has_configmap: bool
    has_progress: bool
    report: RuntimeReport | None  # the runtime's, validated (read_report)
    foreign_configmaps: tuple[str, ...]
    kuberay_missing: bool
    pruned: tuple[str, ...]  # what the API server dropped from the applied manifest (pruned.py)

    @property
    def finished(self) -> bool:
        return self.before.phase in TERMINAL_PHASES

    @property
    def nothing_to_run(self) -> bool:
        """No valid spec and no RayJob named: the job never started (the webhook was bypassed)."""
        return self.run_job is None and self.before.ray_job_name is None

    @property
    def queue(self) -> str | None:
        """The Kueue queue the RayJob waits in (spec.queueName)."""
        return self.run_job.spec.queue_name if self.run_job is not None else None


@dataclass
class Outcome:
    """What one pass decides, the only state the rules change: the new status, the children to apply (in order),
    the RayJobs to delete, Events beside the conditions' own, when to look again, whether the job ends now
    (terminal) and whether the RLJob goes (its TTL)."""

    status: RLJobStatus
    stamp: datetime  # this pass's moment to the second: a condition that flips, startTime and completionTime get it
    apply: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    terminal: bool = False
    delete_rljob: bool = False

    def condition(self, kind: ConditionType, status: bool, reason: ConditionReason, message: str) -> None:
        self.status = with_condition(self.status, kind, status, reason, message, self.stamp)

    def not_running(self, reason: ConditionReason, message: str) -> None:
        self.status = without_running(self.status, reason, message, self.stamp)

    def finish(self, phase: Phase) -> None:
        """The job ends now: Succeeded or Failed, completionTime set (a finished job is never changed again)."""
        self.status.phase, self.status.completion_time = phase, self.stamp
        self.terminal = True


def _facts(observed: Observed, now: datetime, settings: OperatorSettings) -> Facts:
    rljob = observed.rljob
    owner = Owner.of(rljob)
    desired_spec = rljob.get("spec") or {}
    desired, problems = _parse(owner.name, owner.namespace, desired_spec)
    foreign_configmaps = tuple(observed.foreign_configmaps())
    configmap = (
        None
        if observed.configmap is None or observed.configmap["metadata"]["name"] in foreign_configmaps
        else observed.configmap
    )
    progress = (
        None
        if observed.progress is None or observed.progress["metadata"]["name"] in foreign_configmaps
        else observed.progress
    )
    running_spec = configmap_spec(configmap)
    running, _ = _parse(owner.name, owner.namespace, running_spec)

    run_spec, run_job, refusal, safe_change = desired_spec, desired, None, False
    if desired is None:
        run_spec, run_job = (running_spec, running) if running is not None else (None, None)
        refusal = (ConditionReason.INVALID_SPEC, "; ".join(problems))
    elif running is not None and running_spec is not None and runtime_spec_changed(running.spec, desired.spec):
        unsafe = unsafe_changes(running.spec, desired.spec)
        if unsafe:
            run_spec, run_job = running_spec, running
            refusal = (ConditionReason.UNSAFE_SPEC_CHANGE, "; ".join(unsafe))
        else:
            safe_change = True

    before = read_status(rljob.get("status"))
    mine = tuple(rj for rj in observed.rayjobs if owned_by(rj, owner.uid))
    return Facts(
        now=now,
        settings=settings,
        owner=owner,
        generation=int(rljob["metadata"].get("generation") or 0),
        before=before,
        policy=_run_policy(desired_spec, desired or running),
        run_spec=run_spec,
        run_job=run_job,
        refusal=refusal,
        safe_change=safe_change,
        current=next((rj for rj in mine if rj["metadata"]["name"] == before.ray_job_name), None),
        mine=mine,
        foreign=frozenset(rj["metadata"]["name"] for rj in observed.rayjobs if not owned_by(rj, owner.uid)),
        has_configmap=configmap is not None,
        has_progress=progress is not None,
        report=read_report(progress),
        foreign_configmaps=foreign_configmaps,
        kuberay_missing=observed.kuberay_missing,
        pruned=tuple(pruned_fields(rljob)),
    )


def _outcome(f: Facts) -> Outcome:
    """Where the pass starts: the stored status with the generation observed now and the runtime's report."""
    status = f.before.model_copy()
    status.observed_generation = f.generation
    if f.report is not None:
        status = with_report(status, f.report)
    return Outcome(status=status, stamp=to_the_second(f.now))


# -- what each pass does with its facts: helpers of the rules ------------------------------------------------------
def _delete_all_but(f: Facts, out: Outcome, keep: str | None) -> None:
    out.deletes += [rj["metadata"]["name"] for rj in f.mine if rj["metadata"]["name"] != keep]


def _apply_children(f: Facts, out: Outcome, index: int) -> None:
    assert f.run_spec is not None and f.run_job is not None
    autoscaled = f.run_job.spec.resources.autoscaled
    out.apply.extend(build_access(f.owner, f.settings.kuberay, autoscaled=autoscaled))
    out.apply.append(build_configmap(f.owner, f.run_spec, f.generation))
    out.apply.append(
        build_rayjob(
            f.run_job,
            f.owner,
            index,
            default_image=f.settings.runtime_image,
            generation=f.generation,
            head_cpu=f.settings.head_cpu,
            head_memory=f.settings.head_memory,
            ray_version=f.settings.ray_version,
        )
    )


def _new_rayjob(f: Facts, out: Outcome, *, count_restart: bool, reason: ConditionReason, message: str) -> bool:
    """Name the next RayJob in status and create it, deleting every older one; False while the name is taken."""
    name = names.next_rayjob_name(f.owner.name, f.before.ray_job_name)
    if name in f.foreign:
        out.requeue.append(FOREIGN_NAME_RETRY_SECONDS)
        return False
    status = out.status
    status.phase = Phase.QUEUED if f.queue else Phase.STARTING
    status.ray_job_name, status.dashboard_url = name, None
    status.restarts = f.before.restarts + (1 if count_restart else 0)
    status.start_time, status.completion_time = f.before.start_time or out.stamp, None
    out.not_running(reason, message)
    if f.queue:
        waiting = f"RayJob {name} waits in Kueue queue {f.queue} for admission"
        out.condition(ConditionType.QUEUED, True, ConditionReason.WAITING_FOR_ADMISSION, waiting)
    _create_when_alone(f, out, name)
    return True


def _create_when_alone(f: Facts, out: Outcome, name: str) -> None:
    """Delete every other RayJob of the job, and create RayJob `name` only once they are all gone.

    RayJobs are deleted in the foreground (kube.py), so an old one exists until its Ray cluster and
    pods are gone: while it does, its runtime may still be writing a checkpoint, and a second runtime
    on the same checkpoint location would adopt or remove that half-written save."""
    _delete_all_but(f, out, name)
    previous = [rj["metadata"]["name"] for rj in f.mine if rj["metadata"]["name"] != name]
    if previous:
        message = (
            f"RayJob {name} is created once RayJob {', '.join(previous)} and its pods are gone "
            "(two runtimes never share the checkpoint location)"
        )
        out.not_running(ConditionReason.WAITING_FOR_PREVIOUS_RAYJOB, message)
        out.requeue.append(PREVIOUS_RAYJOB_RETRY_SECONDS)
        return
    _apply_children(f, out, names.rayjob_index(f.owner.name, name) or 0)


def _suspended_seconds(f: Facts) -> int:
    """Time spent suspended: the resumed suspensions, plus the one ending now (Suspended=True since it began)."""
    total = f.before.suspended_seconds
    suspended = find_condition(f.before.conditions, ConditionType.SUSPENDED)
    started = f.before.start_time is not None  # the deadline counts from the start: earlier pauses do not matter
    if started and f.before.phase == Phase.SUSPENDED and suspended is not None and suspended.status == TRUE:
        total += max(0, int((f.now - suspended.last_transition_time).total_seconds()))
    return total


def _deadline(f: Facts) -> datetime | None:
    """When runPolicy.activeDeadlineSeconds ends the job, suspended time not counted: None without a deadline,
    before the job started, while it is to be suspended, and for a job that finished or never started."""
    limit, started = f.policy.active_deadline_seconds, f.before.start_time
    if limit is None or started is None or f.policy.suspend or f.finished or f.nothing_to_run:
        return None
    return later(started, limit + _suspended_seconds(f))


# -- the state machine ------------------------------------------------------------------------------------------
Rule = Callable[[Facts, Outcome], None]


def _rule(f: Facts) -> Rule:
    """Which rule decides the pass: the first whose case holds, in the order of the module docstring."""
    deadline = _deadline(f)
    if f.finished:
        return _finished
    if f.nothing_to_run:
        return _invalid
    if deadline is not None and f.now >= deadline:
        return _deadline_exceeded
    if f.policy.suspend:
        return _suspend
    if f.kuberay_missing:
        return _kuberay_missing
    if f.foreign_configmaps:
        return _name_taken
    if f.before.phase == Phase.SUSPENDED:
        return _resume
    if f.before.ray_job_name is None:
        return _first_start
    if f.current is None:
        return _missing
    return _follow


def _finished(f: Facts, out: Outcome) -> None:
    out.terminal = True
    failed = find_condition(f.before.conditions, ConditionType.FAILED)
    deadline = failed is not None and failed.reason == ConditionReason.DEADLINE_EXCEEDED
    _delete_all_but(f, out, None if deadline else f.before.ray_job_name)
    ttl, completed = f.policy.ttl_seconds_after_finished, f.before.completion_time
    if ttl is not None and completed is not None:
        due = later(completed, ttl)
        if f.now >= due:
            out.delete_rljob = True
        else:
            out.requeue.append((due - f.now).total_seconds())


def _invalid(f: Facts, out: Outcome) -> None:
    assert f.refusal is not None  # no valid spec: the refusal says why
    out.status.phase = Phase.PENDING
    out.condition(ConditionType.CREATED, False, ConditionReason.INVALID_SPEC, f.refusal[1])


def _deadline_exceeded(f: Facts, out: Outcome) -> None:
    message = (
        f"the job ran longer than runPolicy.activeDeadlineSeconds ({f.policy.active_deadline_seconds} s); "
        "its RayJobs are deleted"
    )
    out.finish(Phase.FAILED)
    out.status.dashboard_url = None
    out.condition(ConditionType.FAILED, True, ConditionReason.DEADLINE_EXCEEDED, message)
    out.not_running(ConditionReason.DEADLINE_EXCEEDED, message)
    _delete_all_but(f, out, None)


def _suspend(f: Facts, out: Outcome) -> None:
    message = "runPolicy.suspend is true: the Ray cluster is removed, checkpoints are kept"
    out.status.phase, out.status.dashboard_url = Phase.SUSPENDED, None
    out.condition(ConditionType.SUSPENDED, True, ConditionReason.SUSPENDED_BY_USER, message)
    out.not_running(ConditionReason.SUSPENDED_BY_USER, message)
    if is_true(out.status.conditions, ConditionType.QUEUED):
        out.condition(ConditionType.QUEUED, False, ConditionReason.SUSPENDED_BY_USER, message)
    _delete_all_but(f, out, None)


def _kuberay_missing(f: Facts, out: Outcome) -> None:
    out.condition(ConditionType.CREATED, False, ConditionReason.KUBERAY_MISSING, KUBERAY_MISSING)
    out.requeue.append(KUBERAY_RETRY_SECONDS)


def _name_taken(f: Facts, out: Outcome) -> None:
    message = "; ".join(name_taken("ConfigMap", name) for name in f.foreign_configmaps)
    out.condition(ConditionType.CREATED, False, ConditionReason.NAME_TAKEN, message)
    out.requeue.append(NAME_TAKEN_RETRY_SECONDS)


def _resume(f: Facts, out: Outcome) -> None:
    if f.run_job is None:
        return
    name = names.next_rayjob_name(f.owner.name, f.before.ray_job_name)
    message = f"runPolicy.suspend is false: RayJob {name} resumes from the latest checkpoint"
    if _new_rayjob(f, out, count_restart=False, reason=ConditionReason.RESUMED_BY_USER, message=message):
        out.status.suspended_seconds = _suspended_seconds(f)
        out.condition(ConditionType.SUSPENDED, False, ConditionReason.RESUMED_BY_USER, message)


def _first_start(f: Facts, out: Outcome) -> None:
    if f.run_job is not None:
        _new_rayjob(f, out, count_restart=False, reason=ConditionReason.RAYJOB_CREATED, message="")


def _missing(f: Facts, out: Outcome) -> None:
    name = f.before.ray_job_name
    assert name is not None
    if f.run_job is None:
        return
    if name in f.foreign:
        out.requeue.append(FOREIGN_NAME_RETRY_SECONDS)
        return
    # created suspended again when queued: back in the queue
    out.status.phase, out.status.dashboard_url = Phase.QUEUED if f.queue else Phase.STARTING, None
    _create_when_alone(f, out, name)


def _follow(f: Facts, out: Outcome) -> None:
    """The RayJob named in status exists: its state decides (KubeRay's states folded by status.py rayjob_state)."""
    rayjob = f.current
    assert rayjob is not None
    name = rayjob["metadata"]["name"]
    state = rayjob_state(rayjob)
    _delete_all_but(f, out, name)
    if not f.has_configmap and f.run_spec is not None:
        out.apply.append(build_configmap(f.owner, f.run_spec, f.generation))
    if not f.has_progress:
        out.apply.append(build_progress_configmap(f.owner))
    if state in (RayJobState.STARTING, RayJobState.RUNNING) and f.safe_change:
        following = names.next_rayjob_name(f.owner.name, name)
        message = f"spec generation {f.generation} changed: {following} continues from the latest checkpoint"
        if _new_rayjob(f, out, count_restart=False, reason=ConditionReason.SPEC_CHANGED, message=message):
            out.events.append(Event("Normal", ConditionReason.SPEC_CHANGED.value, message))
        return
    if not is_true(out.status.conditions, ConditionType.CREATED):  # only once the RayJob is seen to exist
        out.condition(ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, f"created RayJob {name}")
    out.status.dashboard_url = (rayjob.get("status") or {}).get("dashboardURL") or None
    if state == RayJobState.QUEUED:
        _queued(f, out, name)
        return
    if is_true(out.status.conditions, ConditionType.QUEUED):
        message = f"Kueue admitted RayJob {name} (queue {f.queue if f.run_job is not None else '?'})"
        out.condition(ConditionType.QUEUED, False, ConditionReason.ADMITTED, message)
    if state == RayJobState.STARTING:
        out.status.phase = Phase.STARTING
    elif state == RayJobState.RUNNING:
        out.status.phase = Phase.RUNNING
        out.condition(ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, f"RayJob {name} is running")
    elif state == RayJobState.SUCCEEDED:
        message = f"RayJob {name} succeeded"
        out.finish(Phase.SUCCEEDED)
        out.condition(ConditionType.SUCCEEDED, True, ConditionReason.RAYJOB_SUCCEEDED, message)
        out.not_running(ConditionReason.RAYJOB_SUCCEEDED, message)
    elif state == RayJobState.REFUSED:
        _refused(out, name, rayjob)
    else:
        _failed(f, out, name, rayjob)


def _queued(f: Facts, out: Outcome, name: str) -> None:
    """Kueue holds the RayJob: it has not admitted it yet, or suspended it again (a preemption).

    The reason stays what it was when the hold began: Preempted when the RayJob was running then.
    """
    where = f"Kueue queue {f.queue}" if f.queue else "Kueue"
    held = find_condition(out.status.conditions, ConditionType.QUEUED)
    if is_true(out.status.conditions, ConditionType.RUNNING):
        reason = ConditionReason.PREEMPTED
    elif held is not None and held.status == TRUE and held.reason == ConditionReason.PREEMPTED:
        reason = ConditionReason.PREEMPTED
    else:
        reason = ConditionReason.WAITING_FOR_ADMISSION
    if reason == ConditionReason.PREEMPTED:
        message = f"{where} suspended RayJob {name}; it resumes from the latest checkpoint when admitted again"
    else:
        message = f"RayJob {name} waits in {where} for admission"
    out.status.phase, out.status.dashboard_url = Phase.QUEUED, None
    out.condition(ConditionType.QUEUED, True, reason, message)
    out.not_running(reason, message)


def _refused(out: Outcome, name: str, rayjob: dict[str, Any]) -> None:
    """KubeRay's own validation refused the RayJob (ValidationFailed): Failed with KubeRay's words, no restart.

    A restart builds the same RayJob from the same spec, which KubeRay would refuse the same way. The rules of
    KubeRay 1.6 that an RLJob reaches are refused at the door (api/kuberay.py); this is for the others (a newer
    KubeRay's), so the job says why instead of Starting forever."""
    detail = rayjob_message(rayjob) or "no reason given"
    message = f"KubeRay refused RayJob {name} ({detail}); fix the spec and create the job again"
    out.finish(Phase.FAILED)
    out.status.dashboard_url = None
    out.condition(ConditionType.FAILED, True, ConditionReason.KUBERAY_REFUSED, message)
    out.not_running(ConditionReason.KUBERAY_REFUSED, message)


def _failed(f: Facts, out: Outcome, name: str, rayjob: dict[str, Any]) -> None:
    detail = rayjob_message(rayjob)
    failure = f"RayJob {name} failed" + (f" ({detail})" if detail else "")
    if f.report is not None and f.report.rayjob == name and f.report.configuration_error:
        # Its own run said the job cannot run as specified: a restart would fail the same way. (The job's
        # pods can end their own job this way, as they could by failing every restart; no other job's.)
        message = f"RayJob {name} cannot run as specified: {f.report.configuration_error}"
        out.finish(Phase.FAILED)
        out.condition(ConditionType.FAILED, True, ConditionReason.INVALID_CONFIGURATION, message)
        out.not_running(ConditionReason.RAYJOB_FAILED, failure)
        return
    restarts, limit = f.before.restarts, f.policy.max_restarts
    if restarts >= limit:
        message = f"{failure}; all {limit} restart(s) of runPolicy.maxRestarts are used up"
        out.finish(Phase.FAILED)
        out.condition(ConditionType.FAILED, True, ConditionReason.MAX_RESTARTS_EXCEEDED, message)
        out.not_running(ConditionReason.RAYJOB_FAILED, failure)
        return
    delay = backoff_seconds(f.policy.backoff_seconds, restarts)
    waiting = find_condition(out.status.conditions, ConditionType.RESTARTING)
    since = waiting.last_transition_time if waiting is not None and waiting.status == TRUE else None
    due = later(since or f.now, delay)
    if f.now >= due:
        following = names.next_rayjob_name(f.owner.name, name)
        message = f"{failure}; restart {restarts + 1} of {limit}: {following} resumes from the latest checkpoint"
        if _new_rayjob(f, out, count_restart=True, reason=ConditionReason.RESTARTED_FROM_CHECKPOINT, message=message):
            out.condition(ConditionType.RESTARTING, False, ConditionReason.RESTARTED_FROM_CHECKPOINT, message)
        return
    message = f"{failure}; restart {restarts + 1} of {limit} after a backoff of {delay:g} s"
    out.status.phase = Phase.RESTARTING
    out.condition(ConditionType.RESTARTING, True, ConditionReason.BACKOFF, message)
    out.not_running(ConditionReason.RAYJOB_FAILED, failure)
    out.requeue.append((due - f.now).total_seconds())


# -- after the rule: what every pass adds ---------------------------------------------------------------------
def _watch_deadline(f: Facts, out: Outcome) -> None:
    """A job with an active deadline ahead gets a pass when it is due."""
    deadline = _deadline(f)
    if deadline is not None and f.now < deadline:
        out.requeue.append((deadline - f.now).total_seconds())


def _spec_refusal(f: Facts, out: Outcome) -> None:
    """SpecChangeRefused=True while the desired spec is not the one that runs; False once it is again. A job that
    never started has no running spec to refuse it against: Created=False says why (`_invalid`)."""
    if out.terminal:
        return
    refusal = None if f.nothing_to_run else f.refusal
    if refusal is not None:
        out.condition(ConditionType.SPEC_CHANGE_REFUSED, True, *refusal)
    elif is_true(out.status.conditions, ConditionType.SPEC_CHANGE_REFUSED):
        out.condition(
            ConditionType.SPEC_CHANGE_REFUSED,
            False,
            ConditionReason.SPEC_CHANGED,
            f"the job runs spec generation {f.generation}",
        )


def _unknown_fields(f: Facts, out: Outcome) -> None:
    """UnknownFields=True naming what the API server dropped from the applied manifest; False once it is fixed."""
    if f.pruned:
        message = (
            f"the API server dropped {', '.join(f.pruned)} from the applied manifest: not fields of an RLJob, so "
            "the job runs without them (defaults instead). Fix the manifest; `kuberl validate` names each one"
        )
        out.condition(ConditionType.UNKNOWN_FIELDS, True, ConditionReason.FIELDS_PRUNED, message)
    elif is_true(out.status.conditions, ConditionType.UNKNOWN_FIELDS):
        message = "the applied manifest has no field the API server dropped"
        out.condition(ConditionType.UNKNOWN_FIELDS, False, ConditionReason.NO_FIELDS_PRUNED, message)


def _schedule_ttl(f: Facts, out: Outcome) -> None:
    """The pass that finishes the job schedules the TTL's own pass: the status write it makes is the operator's own
    and may bring no further event (completionTime counts in whole seconds, so `ttl` after now is never early)."""
    ttl = f.policy.ttl_seconds_after_finished
    if out.terminal and not f.finished and ttl is not None:
        out.requeue.append(float(ttl))


def name_taken(kind: str, name: str) -> str:
    return (
        f"a {kind} named {name} exists and does not belong to this RLJob (no owner reference to it); "
        "the operator does not take it over: delete or rename it, or give the RLJob another name"
    )


def apply_failed(
    status: RLJobStatus,
    kind: str,
    name: str,
    message: str,
    now: datetime,
    reason: ConditionReason = ConditionReason.APPLY_FAILED,
) -> RLJobStatus:
    """The status after the API server refused to create or update a child: Created=False with its words; with
    another reason (KubeRayTooOld) the message is the operator's own."""
    detail = f"the API server refused {kind} {name}: {message}" if reason == ConditionReason.APPLY_FAILED else message
    return with_condition(status, ConditionType.CREATED, False, reason, detail, now)


def transition_events(before: RLJobStatus, after: RLJobStatus) -> list[Event]:
    events = []
    for condition in flipped(before.conditions, after.conditions):
        if condition.type == ConditionType.RUNNING and condition.status == FALSE:
            continue  # always beside another flip that says why
        kind = "Warning" if (condition.type, condition.status) in WARNINGS else "Normal"
        message = condition.message or f"{condition.type.value} is {condition.status.value}"
        events.append(Event(kind, condition.reason.value, message))
    return events


def decide(observed: Observed, now: datetime, settings: OperatorSettings) -> Decision:
    """What to do about one RLJob now (see the module docstring for the rules)."""
    f = _facts(observed, now, settings)
    out = _outcome(f)
    _rule(f)(f, out)
    _watch_deadline(f, out)
    _spec_refusal(f, out)
    _unknown_fields(f, out)
    _schedule_ttl(f, out)
    return Decision(
        status=out.status,
        write_status=status_manifest(out.status) != status_manifest(f.before),
        apply=tuple(out.apply),
        delete_rayjobs=tuple(dict.fromkeys(out.deletes)),
        delete_rljob=out.delete_rljob,
        events=tuple(transition_events(f.before, out.status) + out.events),
        requeue_after=max(0.0, min(out.requeue)) if out.requeue else None,
    )
