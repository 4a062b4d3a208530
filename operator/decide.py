"""The decision of one reconcile pass: a pure function from what was observed to what to do.

`decide(observed, now, settings)` reads the RLJob (spec and the status written so far), the
job's RayJobs, its spec ConfigMap and the runtime's report, and returns a `Decision`: the status,
the children to apply, the RayJobs to delete, the Events to post and when to look again. It
reads no clock and does no I/O, so every rule is a table test (tests/unit/operator/).

The pass is an explicit state machine, as in KubeRay: the first of these steps that applies
decides it.

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

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from kuberl.api import ManifestError, RLJob, parse_rljob
from kuberl.api.enums import TERMINAL_PHASES, ConditionReason, ConditionType, Phase
from kuberl.api.spec import RunPolicy
from kuberl.api.specdiff import runtime_spec_changed, unsafe_changes
from kuberl.api.status import RuntimeReport
from kuberl.operator import names
from kuberl.operator.access import build_access, build_progress_configmap
from kuberl.operator.builders import Owner, build_configmap, build_rayjob, configmap_spec, spec_manifest
from kuberl.operator.pruned import pruned_fields
from kuberl.operator.settings import OperatorSettings
from kuberl.operator.status import (
    OperatorStatus,
    RayJobState,
    find_condition,
    flipped,
    format_time,
    is_true,
    parse_time,
    rayjob_message,
    rayjob_state,
    read_report,
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
WARNINGS = {
    (ConditionType.FAILED.value, "True"),
    (ConditionType.SPEC_CHANGE_REFUSED.value, "True"),
    (ConditionType.RESTARTING.value, "True"),
    (ConditionType.CREATED.value, "False"),
    (ConditionType.UNKNOWN_FIELDS.value, "True"),
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
    status: OperatorStatus
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


@dataclass
class _Pass:
    """The working state of one decision (local to `decide`; nothing escapes but the Decision)."""

    now: datetime
    settings: OperatorSettings
    owner: Owner
    generation: int
    before: OperatorStatus
    status: OperatorStatus
    policy: RunPolicy
    run_spec: dict[str, Any] | None  # the raw spec a RayJob created now would run
    run_job: RLJob | None
    refusal: tuple[ConditionReason, str] | None  # why the desired spec is not the one that runs
    safe_change: bool  # the desired spec differs from the running one and may replace it
    current: dict[str, Any] | None  # the RayJob named in status, when it exists and is ours
    mine: list[dict[str, Any]]
    foreign: set[str]  # names held by RayJobs of another owner (a deleted RLJob of the same name)
    has_configmap: bool
    has_progress: bool
    report: RuntimeReport | None  # the runtime's, validated (read_report)
    foreign_configmaps: list[str]
    kuberay_missing: bool
    apply: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: list[float] = field(default_factory=list)
    delete_rljob: bool = False
    terminal: bool = False

    def now_text(self) -> str:
        return format_time(self.now)

    def condition(self, kind: ConditionType, status: bool, reason: ConditionReason, message: str) -> None:
        self.status = self.status.with_condition(kind, status, reason, message, self.now)

    def not_running(self, reason: ConditionReason, message: str) -> None:
        self.status = self.status.without_running(reason, message, self.now)

    def delete_all_but(self, keep: str | None) -> None:
        self.deletes += [rj["metadata"]["name"] for rj in self.mine if rj["metadata"]["name"] != keep]

    def apply_children(self, index: int) -> None:
        assert self.run_spec is not None and self.run_job is not None
        autoscaled = self.run_job.spec.resources.autoscaled
        self.apply.extend(build_access(self.owner, self.settings.kuberay, autoscaled=autoscaled))
        self.apply.append(build_configmap(self.owner, self.run_spec, self.generation))
        self.apply.append(
            build_rayjob(
                self.run_job,
                self.owner,
                index,
                default_image=self.settings.runtime_image,
                generation=self.generation,
                head_cpu=self.settings.head_cpu,
                head_memory=self.settings.head_memory,
                ray_version=self.settings.ray_version,
            )
        )

    def new_rayjob(self, *, count_restart: bool, reason: ConditionReason, message: str) -> bool:
        """Name the next RayJob in status and create it, deleting every older one; False while the name is taken."""
        name = names.next_rayjob_name(self.owner.name, self.before.ray_job_name)
        if name in self.foreign:
            self.requeue.append(FOREIGN_NAME_RETRY_SECONDS)
            return False
        queue = self.run_job.spec.queue_name if self.run_job is not None else None
        self.status = replace(
            self.status,
            phase=Phase.QUEUED if queue else Phase.STARTING,
            ray_job_name=name,
            dashboard_url=None,
            restarts=self.before.restarts + (1 if count_restart else 0),
            start_time=self.before.start_time or self.now_text(),
            completion_time=None,
        )
        self.not_running(reason, message)
        if queue:
            waiting = f"RayJob {name} waits in Kueue queue {queue} for admission"
            self.condition(ConditionType.QUEUED, True, ConditionReason.WAITING_FOR_ADMISSION, waiting)
        self.create_when_alone(name)
        return True

    def create_when_alone(self, name: str) -> None:
        """Delete every other RayJob of the job, and create RayJob `name` only once they are all gone.

        RayJobs are deleted in the foreground (kube.py), so an old one exists until its Ray cluster and
        pods are gone: while it does, its runtime may still be writing a checkpoint, and a second runtime
        on the same checkpoint location would adopt or remove that half-written save."""
        self.delete_all_but(name)
        previous = [rj["metadata"]["name"] for rj in self.mine if rj["metadata"]["name"] != name]
        if previous:
            message = (
                f"RayJob {name} is created once RayJob {', '.join(previous)} and its pods are gone "
                "(two runtimes never share the checkpoint location)"
            )
            self.not_running(ConditionReason.WAITING_FOR_PREVIOUS_RAYJOB, message)
            self.requeue.append(PREVIOUS_RAYJOB_RETRY_SECONDS)
            return
        self.apply_children(names.rayjob_index(self.owner.name, name) or 0)


def _start(observed: Observed, now: datetime, settings: OperatorSettings) -> _Pass:
    rljob = observed.rljob
    meta = rljob["metadata"]
    owner = Owner.of(rljob)
    before = OperatorStatus.from_status(rljob.get("status"))
    desired_spec = rljob.get("spec") or {}
    desired, problems = _parse(owner.name, owner.namespace, desired_spec)
    foreign_configmaps = observed.foreign_configmaps()
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

    mine = [rj for rj in observed.rayjobs if owned_by(rj, owner.uid)]
    current = next((rj for rj in mine if rj["metadata"]["name"] == before.ray_job_name), None)
    source = desired or running
    status = replace(before, observed_generation=meta.get("generation"))
    report = read_report(progress)
    if report is not None:
        status = status.with_report(report)
    return _Pass(
        now=now,
        settings=settings,
        owner=owner,
        generation=int(meta.get("generation") or 0),
        before=before,
        status=status,
        policy=_run_policy(desired_spec, source),
        run_spec=run_spec,
        run_job=run_job,
        refusal=refusal,
        safe_change=safe_change,
        current=current,
        mine=mine,
        foreign={rj["metadata"]["name"] for rj in observed.rayjobs if not owned_by(rj, owner.uid)},
        has_configmap=configmap is not None,
        has_progress=progress is not None,
        report=report,
        foreign_configmaps=foreign_configmaps,
        kuberay_missing=observed.kuberay_missing,
    )


def _finished(p: _Pass) -> bool:
    if p.before.phase not in TERMINAL_PHASES:
        return False
    p.terminal = True
    failed = find_condition(p.before.conditions, ConditionType.FAILED)
    deadline = failed is not None and failed.get("reason") == ConditionReason.DEADLINE_EXCEEDED.value
    p.delete_all_but(None if deadline else p.before.ray_job_name)
    ttl, completed = p.policy.ttl_seconds_after_finished, parse_time(p.before.completion_time)
    if ttl is not None and completed is not None:
        due = later(completed, ttl)
        if p.now >= due:
            p.delete_rljob = True
        else:
            p.requeue.append((due - p.now).total_seconds())
    return True


def _invalid(p: _Pass) -> bool:
    if p.run_job is not None or p.before.ray_job_name is not None:
        return False
    assert p.refusal is not None
    p.status = replace(p.status, phase=Phase.PENDING)
    p.condition(ConditionType.CREATED, False, ConditionReason.INVALID_SPEC, p.refusal[1])
    p.refusal = None  # reported by Created=False; nothing runs that it could be refused against
    return True


def _suspended_seconds(p: _Pass) -> int:
    """Time spent suspended: the resumed suspensions, plus the one ending now (Suspended=True since it began)."""
    total = p.before.suspended_seconds
    suspended = find_condition(p.before.conditions, ConditionType.SUSPENDED)
    started = p.before.start_time is not None  # the deadline counts from the start: earlier pauses do not matter
    if started and p.before.phase == Phase.SUSPENDED and suspended is not None and suspended.get("status") == "True":
        since = parse_time(suspended.get("lastTransitionTime"))
        total += max(0, int((p.now - since).total_seconds())) if since is not None else 0
    return total


def _deadline(p: _Pass) -> bool:
    limit, started = p.policy.active_deadline_seconds, parse_time(p.before.start_time)
    if limit is None or started is None or p.policy.suspend:
        return False
    due = later(started, limit + _suspended_seconds(p))  # suspended time does not count
    if p.now < due:
        p.requeue.append((due - p.now).total_seconds())
        return False
    message = f"the job ran longer than runPolicy.activeDeadlineSeconds ({limit} s); its RayJobs are deleted"
    p.status = replace(p.status, phase=Phase.FAILED, completion_time=p.now_text(), dashboard_url=None)
    p.condition(ConditionType.FAILED, True, ConditionReason.DEADLINE_EXCEEDED, message)
    p.not_running(ConditionReason.DEADLINE_EXCEEDED, message)
    p.delete_all_but(None)
    p.terminal = True
    return True


def _suspend(p: _Pass) -> bool:
    if not p.policy.suspend:
        return False
    message = "runPolicy.suspend is true: the Ray cluster is removed, checkpoints are kept"
    p.status = replace(p.status, phase=Phase.SUSPENDED, dashboard_url=None)
    p.condition(ConditionType.SUSPENDED, True, ConditionReason.SUSPENDED_BY_USER, message)
    p.not_running(ConditionReason.SUSPENDED_BY_USER, message)
    if is_true(p.status.conditions, ConditionType.QUEUED):
        p.condition(ConditionType.QUEUED, False, ConditionReason.SUSPENDED_BY_USER, message)
    p.delete_all_but(None)
    return True


def _kuberay_missing(p: _Pass) -> bool:
    if not p.kuberay_missing:
        return False
    p.condition(ConditionType.CREATED, False, ConditionReason.KUBERAY_MISSING, KUBERAY_MISSING)
    p.requeue.append(KUBERAY_RETRY_SECONDS)
    return True


def _name_taken(p: _Pass) -> bool:
    if not p.foreign_configmaps:
        return False
    message = "; ".join(name_taken("ConfigMap", name) for name in p.foreign_configmaps)
    p.condition(ConditionType.CREATED, False, ConditionReason.NAME_TAKEN, message)
    p.requeue.append(NAME_TAKEN_RETRY_SECONDS)
    return True


def _resume(p: _Pass) -> bool:
    if p.before.phase != Phase.SUSPENDED:
        return False
    if p.run_job is None:
        return True
    name = names.next_rayjob_name(p.owner.name, p.before.ray_job_name)
    message = f"runPolicy.suspend is false: RayJob {name} resumes from the latest checkpoint"
    if p.new_rayjob(count_restart=False, reason=ConditionReason.RESUMED_BY_USER, message=message):
        p.status = replace(p.status, suspended_seconds=_suspended_seconds(p))
        p.condition(ConditionType.SUSPENDED, False, ConditionReason.RESUMED_BY_USER, message)
    return True


def _first_start(p: _Pass) -> bool:
    if p.before.ray_job_name is not None:
        return False
    if p.run_job is not None:
        p.new_rayjob(count_restart=False, reason=ConditionReason.RAYJOB_CREATED, message="")
    return True


def _missing(p: _Pass) -> bool:
    if p.current is not None:
        return False
    name = p.before.ray_job_name
    assert name is not None
    if p.run_job is None:
        return True
    if name in p.foreign:
        p.requeue.append(FOREIGN_NAME_RETRY_SECONDS)
        return True
    queued = p.run_job.spec.queue_name is not None  # created suspended again: back in the queue
    p.status = replace(p.status, phase=Phase.QUEUED if queued else Phase.STARTING, dashboard_url=None)
    p.create_when_alone(name)
    return True


def _follow(p: _Pass) -> bool:
    rayjob = p.current
    assert rayjob is not None
    name = rayjob["metadata"]["name"]
    state = rayjob_state(rayjob)
    p.delete_all_but(name)
    if not p.has_configmap and p.run_spec is not None:
        p.apply.append(build_configmap(p.owner, p.run_spec, p.generation))
    if not p.has_progress:
        p.apply.append(build_progress_configmap(p.owner))
    if state in (RayJobState.STARTING, RayJobState.RUNNING) and p.safe_change:
        following = names.next_rayjob_name(p.owner.name, name)
        message = f"spec generation {p.generation} changed: {following} continues from the latest checkpoint"
        if p.new_rayjob(count_restart=False, reason=ConditionReason.SPEC_CHANGED, message=message):
            p.events.append(Event("Normal", ConditionReason.SPEC_CHANGED.value, message))
        return True
    if not is_true(p.status.conditions, ConditionType.CREATED):  # only once the RayJob is seen to exist
        p.condition(ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, f"created RayJob {name}")
    dashboard = (rayjob.get("status") or {}).get("dashboardURL") or None
    p.status = replace(p.status, dashboard_url=dashboard)
    if state == RayJobState.QUEUED:
        _queued(p, name)
        return True
    if is_true(p.status.conditions, ConditionType.QUEUED):
        message = f"Kueue admitted RayJob {name} (queue {p.run_job.spec.queue_name if p.run_job else '?'})"
        p.condition(ConditionType.QUEUED, False, ConditionReason.ADMITTED, message)
    if state == RayJobState.STARTING:
        p.status = replace(p.status, phase=Phase.STARTING)
    elif state == RayJobState.RUNNING:
        p.status = replace(p.status, phase=Phase.RUNNING)
        p.condition(ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, f"RayJob {name} is running")
    elif state == RayJobState.SUCCEEDED:
        message = f"RayJob {name} succeeded"
        p.status = replace(p.status, phase=Phase.SUCCEEDED, completion_time=p.now_text())
        p.condition(ConditionType.SUCCEEDED, True, ConditionReason.RAYJOB_SUCCEEDED, message)
        p.not_running(ConditionReason.RAYJOB_SUCCEEDED, message)
        p.terminal = True
    elif state == RayJobState.REFUSED:
        _refused(p, name, rayjob)
    else:
        _failed(p, name, rayjob)
    return True


def _queued(p: _Pass, name: str) -> None:
    """Kueue holds the RayJob: it has not admitted it yet, or suspended it again (a preemption).

    The reason stays what it was when the hold began: Preempted when the RayJob was running then.
    """
    queue = p.run_job.spec.queue_name if p.run_job is not None else None
    where = f"Kueue queue {queue}" if queue else "Kueue"
    held = find_condition(p.status.conditions, ConditionType.QUEUED)
    if is_true(p.status.conditions, ConditionType.RUNNING):
        reason = ConditionReason.PREEMPTED
    elif held is not None and held.get("status") == "True" and held.get("reason") == ConditionReason.PREEMPTED:
        reason = ConditionReason.PREEMPTED
    else:
        reason = ConditionReason.WAITING_FOR_ADMISSION
    if reason == ConditionReason.PREEMPTED:
        message = f"{where} suspended RayJob {name}; it resumes from the latest checkpoint when admitted again"
    else:
        message = f"RayJob {name} waits in {where} for admission"
    p.status = replace(p.status, phase=Phase.QUEUED, dashboard_url=None)
    p.condition(ConditionType.QUEUED, True, reason, message)
    p.not_running(reason, message)


def _refused(p: _Pass, name: str, rayjob: dict[str, Any]) -> None:
    """KubeRay's own validation refused the RayJob (ValidationFailed): Failed with KubeRay's words, no restart.

    A restart builds the same RayJob from the same spec, which KubeRay would refuse the same way. The rules of
    KubeRay 1.6 that an RLJob reaches are refused at the door (api/kuberay.py); this is for the others (a newer
    KubeRay's), so the job says why instead of Starting forever."""
    detail = rayjob_message(rayjob) or "no reason given"
    message = f"KubeRay refused RayJob {name} ({detail}); fix the spec and create the job again"
    p.status = replace(p.status, phase=Phase.FAILED, completion_time=p.now_text(), dashboard_url=None)
    p.condition(ConditionType.FAILED, True, ConditionReason.KUBERAY_REFUSED, message)
    p.not_running(ConditionReason.KUBERAY_REFUSED, message)
    p.terminal = True


def _failed(p: _Pass, name: str, rayjob: dict[str, Any]) -> None:
    detail = rayjob_message(rayjob)
    failure = f"RayJob {name} failed" + (f" ({detail})" if detail else "")
    if p.report is not None and p.report.rayjob == name and p.report.configuration_error:
        # Its own run said the job cannot run as specified: a restart would fail the same way. (The job's
        # pods can end their own job this way, as they could by failing every restart; no other job's.)
        message = f"RayJob {name} cannot run as specified: {p.report.configuration_error}"
        p.status = replace(p.status, phase=Phase.FAILED, completion_time=p.now_text())
        p.condition(ConditionType.FAILED, True, ConditionReason.INVALID_CONFIGURATION, message)
        p.not_running(ConditionReason.RAYJOB_FAILED, failure)
        p.terminal = True
        return
    restarts, limit = p.before.restarts, p.policy.max_restarts
    if restarts >= limit:
        message = f"{failure}; all {limit} restart(s) of runPolicy.maxRestarts are used up"
        p.status = replace(p.status, phase=Phase.FAILED, completion_time=p.now_text())
        p.condition(ConditionType.FAILED, True, ConditionReason.MAX_RESTARTS_EXCEEDED, message)
        p.not_running(ConditionReason.RAYJOB_FAILED, failure)
        p.terminal = True
        return
    delay = backoff_seconds(p.policy.backoff_seconds, restarts)
    waiting = find_condition(p.status.conditions, ConditionType.RESTARTING)
    since = parse_time(waiting.get("lastTransitionTime")) if waiting and waiting.get("status") == "True" else None
    due = later(since or p.now, delay)
    if p.now >= due:
        following = names.next_rayjob_name(p.owner.name, name)
        message = f"{failure}; restart {restarts + 1} of {limit}: {following} resumes from the latest checkpoint"
        if p.new_rayjob(count_restart=True, reason=ConditionReason.RESTARTED_FROM_CHECKPOINT, message=message):
            p.condition(ConditionType.RESTARTING, False, ConditionReason.RESTARTED_FROM_CHECKPOINT, message)
        return
    message = f"{failure}; restart {restarts + 1} of {limit} after a backoff of {delay:g} s"
    p.status = replace(p.status, phase=Phase.RESTARTING)
    p.condition(ConditionType.RESTARTING, True, ConditionReason.BACKOFF, message)
    p.not_running(ConditionReason.RAYJOB_FAILED, failure)
    p.requeue.append((due - p.now).total_seconds())


STEPS = (
    _finished,
    _invalid,
    _deadline,
    _suspend,
    _kuberay_missing,
    _name_taken,
    _resume,
    _first_start,
    _missing,
    _follow,
)


def _spec_refusal(p: _Pass) -> None:
    if p.terminal:
        return
    if p.refusal is not None:
        p.condition(ConditionType.SPEC_CHANGE_REFUSED, True, p.refusal[0], p.refusal[1])
    elif is_true(p.status.conditions, ConditionType.SPEC_CHANGE_REFUSED):
        p.condition(
            ConditionType.SPEC_CHANGE_REFUSED,
            False,
            ConditionReason.SPEC_CHANGED,
            f"the job runs spec generation {p.generation}",
        )


def name_taken(kind: str, name: str) -> str:
    return (
        f"a {kind} named {name} exists and does not belong to this RLJob (no owner reference to it); "
        "the operator does not take it over: delete or rename it, or give the RLJob another name"
    )


def apply_failed(
    status: OperatorStatus,
    kind: str,
    name: str,
    message: str,
    now: datetime,
    reason: ConditionReason = ConditionReason.APPLY_FAILED,
) -> OperatorStatus:
    """The status after the API server refused to create or update a child: Created=False with its words; with
    another reason (KubeRayTooOld) the message is the operator's own."""
    detail = f"the API server refused {kind} {name}: {message}" if reason == ConditionReason.APPLY_FAILED else message
    return status.with_condition(ConditionType.CREATED, False, reason, detail, now)


def _unknown_fields(p: _Pass, rljob: dict[str, Any]) -> None:
    """UnknownFields=True naming what the API server dropped from the applied manifest; False once it is fixed."""
    dropped = pruned_fields(rljob)
    if dropped:
        message = (
            f"the API server dropped {', '.join(dropped)} from the applied manifest: not fields of an RLJob, so "
            "the job runs without them (defaults instead). Fix the manifest; `kuberl validate` names each one"
        )
        p.condition(ConditionType.UNKNOWN_FIELDS, True, ConditionReason.FIELDS_PRUNED, message)
    elif is_true(p.status.conditions, ConditionType.UNKNOWN_FIELDS):
        message = "the applied manifest has no field the API server dropped"
        p.condition(ConditionType.UNKNOWN_FIELDS, False, ConditionReason.NO_FIELDS_PRUNED, message)


def transition_events(before: OperatorStatus, after: OperatorStatus) -> list[Event]:
    events = []
    for condition in flipped(before.conditions, after.conditions):
        if condition["type"] == ConditionType.RUNNING.value and condition["status"] == "False":
            continue  # always beside another flip that says why
        kind = "Warning" if (condition["type"], condition["status"]) in WARNINGS else "Normal"
        message = condition.get("message") or f"{condition['type']} is {condition['status']}"
        events.append(Event(kind, condition["reason"], message))
    return events


def decide(observed: Observed, now: datetime, settings: OperatorSettings) -> Decision:
    """What to do about one RLJob now (see the module docstring for the steps)."""
    p = _start(observed, now, settings)
    for step in STEPS:
        if step(p):
            break
    _spec_refusal(p)
    _unknown_fields(p, observed.rljob)
    ttl = p.policy.ttl_seconds_after_finished
    if p.terminal and p.before.phase not in TERMINAL_PHASES and ttl is not None:
        # the pass that finishes the job schedules the TTL's own pass: the status write it makes is
        # the operator's own and may bring no further event (completionTime counts in whole seconds,
        # so `ttl` after now is never early)
        p.requeue.append(float(ttl))
    events = transition_events(p.before, p.status) + p.events
    return Decision(
        status=p.status,
        write_status=p.status.to_status() != p.before.to_status(),
        apply=tuple(p.apply),
        delete_rayjobs=tuple(dict.fromkeys(p.deletes)),
        delete_rljob=p.delete_rljob,
        events=tuple(events),
        requeue_after=max(0.0, min(p.requeue)) if p.requeue else None,
    )
