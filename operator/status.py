"""Pure status pieces: what a KubeRay RayJob's status means for the job, and Kubernetes-style conditions.

KubeRay reports `status.jobDeploymentStatus` (New, Initializing, Running, Complete, Failed,
Suspending, Suspended, Retrying, Waiting, ValidationFailed) and `status.jobStatus` (PENDING, RUNNING, STOPPED,
SUCCEEDED, FAILED). `rayjob_state` folds them, and the RayJob's `spec.suspend` (which only Kueue
moves: the operator sets it once, at creation, on a queued job), into the states the operator acts on. A
condition's `lastTransitionTime` moves only when its status flips; reason and message may change
without a flip.

The status the operator writes is api/status.py's `RLJobStatus` (the model the CRD's status schema is generated
from): `read_status` reads it from the RLJob, `status_manifest` writes it, camelCase, with times in RFC 3339 to the
second as Kubernetes writes them.
"""

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import ValidationError

from kuberl.api.base import KuberlModel
from kuberl.api.enums import ConditionReason, ConditionStatus, ConditionType
from kuberl.api.status import REPORT_KEY, Condition, RLJobStatus, RuntimeReport

ReportPart = TypeVar("ReportPart", bound=KuberlModel)


class RayJobState(StrEnum):
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    #: KubeRay refused the RayJob after it was created: the same spec is refused the same way, so never restarted.
    REFUSED = "Refused"


#: KubeRay's jobDeploymentStatus for a RayJob its own validation refused (ray-operator/controllers/ray/
#: rayjob_controller.go at v1.6.2: `validateRayJob` fails, the status gets this, reason ValidationFailed and
#: the error as message, and KubeRay does nothing more with the RayJob).
VALIDATION_FAILED = "ValidationFailed"


def rayjob_state(rayjob: dict[str, Any]) -> RayJobState:
    """Succeeded only on jobStatus SUCCEEDED; Refused when KubeRay's validation refused it; Failed on
    FAILED/STOPPED or deployment Failed (or Complete without success); Queued while suspended (Kueue has not
    admitted it, or preempted it) or until KubeRay has finished suspending or resuming it; Running once deployed
    and not PENDING; everything else is still starting."""
    status = rayjob.get("status") or {}
    deployment, job = status.get("jobDeploymentStatus") or "", status.get("jobStatus") or ""
    if job == "SUCCEEDED":
        return RayJobState.SUCCEEDED
    if deployment == VALIDATION_FAILED:
        return RayJobState.REFUSED
    if job in ("FAILED", "STOPPED") or deployment in ("Failed", "Complete"):
        return RayJobState.FAILED
    if (rayjob.get("spec") or {}).get("suspend") or deployment in ("Suspending", "Suspended"):
        return RayJobState.QUEUED
    if job == "RUNNING" or (deployment == "Running" and job != "PENDING"):
        return RayJobState.RUNNING
    return RayJobState.STARTING


#: The most of KubeRay's message a condition carries. KubeRay puts up to the last 20,000 characters of the job's
#: log in it; a condition keeps the message's first line (what failed) and the log's end (the error raised).
RAYJOB_MESSAGE_LIMIT = 1500
#: Terminal colour codes (Ray prefixes each worker's lines with them): noise in `kubectl describe`.
_COLOURS = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def rayjob_message(rayjob: dict[str, Any]) -> str:
    """KubeRay's own explanation (status.reason / status.message), when it gave one, without colour codes and
    cut to its first line and its end when long."""
    status = rayjob.get("status") or {}
    parts = [_COLOURS.sub("", str(status[key])).strip() for key in ("reason", "message") if status.get(key)]
    text = ": ".join(part for part in parts if part)
    if len(text) <= RAYJOB_MESSAGE_LIMIT:
        return text
    head, gap = text.split("\n", 1)[0][: RAYJOB_MESSAGE_LIMIT // 3], "\n[...]\n"
    tail = text[len(text) - (RAYJOB_MESSAGE_LIMIT - len(head) - len(gap)) :]
    return head + gap + tail


def to_the_second(moment: datetime) -> datetime:
    """`moment` as Kubernetes writes times: UTC, whole seconds (RFC 3339 `2025-01-01T12:00:00Z` on the wire)."""
    return moment.astimezone(UTC).replace(microsecond=0)


def format_time(moment: datetime) -> str:
    return to_the_second(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_report(configmap: dict[str, Any] | None) -> RuntimeReport | None:
    """The runtime's report in its ConfigMap; None when there is none yet or it does not validate.

    The report comes from the job's own pods: only what the models accept is used (numbers in range,
    known fields), and nothing in it can move a phase, a condition, a name or a time of the operator's, with
    one exception that only ends the reporting job itself: a RayJob KubeRay reports failed, whose own run
    reported a configuration error (`rayjob` names it), is not restarted (decide.py `_failed`).
    """
    text = ((configmap or {}).get("data") or {}).get(REPORT_KEY)
    if not text:
        return None
    try:
        return RuntimeReport.model_validate_json(text)
    except ValueError:
        return None


def find_condition(conditions: Sequence[Condition], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: Sequence[Condition], kind: ConditionType) -> bool:
    found = find_condition(conditions, kind)
    return found is not None and found.status == ConditionStatus.TRUE


def set_condition(
    conditions: Sequence[Condition],
    kind: ConditionType,
    status: bool,
    reason: ConditionReason,
    message: str,
    now: datetime,
) -> list[Condition]:
    """The conditions with `kind` set; its lastTransitionTime moves only when its status flips (or it is new)."""
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    old = find_condition(conditions, kind)
    since = old.last_transition_time if old is not None and old.status == value else to_the_second(now)
    new = Condition(type=kind, status=value, reason=reason, message=message, last_transition_time=since)
    if old is None:
        return [*conditions, new]
    return [new if c is old else c for c in conditions]


def flipped(before: Sequence[Condition], after: Sequence[Condition]) -> list[Condition]:
    """Conditions of `after` that are new or whose status differs from `before`."""
    old = {c.type: c.status for c in before}
    return [c for c in after if old.get(c.type) != c.status]


# -- the status the operator writes: api/status.py's RLJobStatus, read from and written to the RLJob -------------
def read_status(stored: dict[str, Any] | None) -> RLJobStatus:
    """The RLJob's status as stored. The API server holds it to the CRD's schema, which RLJobStatus generates, so it
    validates; a field or condition that does not (an unknown phase: a status written by hand or by another
    version) is read as unset, and the operator writes its own in its place."""
    stored = stored or {}
    valid: dict[str, Any] = {}
    for name, field in RLJobStatus.model_fields.items():
        key = field.alias or name
        if key in stored and key != "conditions" and _valid({key: stored[key]}):
            valid[key] = stored[key]
    conditions = stored.get("conditions") or []
    valid["conditions"] = [c for c in conditions if isinstance(c, dict) and _valid({"conditions": [c]})]
    return RLJobStatus.model_validate(valid)


def _valid(status: dict[str, Any]) -> bool:
    try:
        RLJobStatus.model_validate(status)
    except ValidationError:
        return False
    return True


def status_manifest(status: RLJobStatus) -> dict[str, Any]:
    """The status to apply, camelCase, times in RFC 3339. A field that is null is left out, so server-side apply
    removes it where this field manager wrote it before; so is suspendedSeconds while it is 0; phase, conditions
    and restarts are always there. What was read is written back as it was read: a default the stored status left
    out (progress.epoch, a condition's message) stays out (pydantic's unset fields; `with_report` sets them)."""
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    wire.setdefault("phase", status.phase.value)
    wire.setdefault("conditions", [])
    wire.setdefault("restarts", status.restarts)
    if not status.suspended_seconds:
        wire.pop("suspendedSeconds", None)
    return wire


def with_report(status: RLJobStatus, report: RuntimeReport) -> RLJobStatus:
    """The runtime's progress, metrics, validation, last checkpoint and exported model, validated (read_report);
    the rest stays the operator's. Each part is written as its model spells it out (progress.epoch: 0 too)."""
    new = status.model_copy()
    new.progress, new.metrics = _spelled_out(report.progress), _spelled_out(report.metrics)
    if report.validation is not None:  # a report without one keeps the last scores
        new.validation = _spelled_out(report.validation)
    if report.last_checkpoint is not None:
        new.last_checkpoint = _spelled_out(report.last_checkpoint)
    new.exported_model = report.exported_model or status.exported_model
    return new


def _spelled_out(part: ReportPart) -> ReportPart:
    """`part` with every field that is not null set, its defaults included, so status_manifest writes them."""
    return type(part).model_validate(part.to_manifest())


def with_condition(
    status: RLJobStatus, kind: ConditionType, value: bool, reason: ConditionReason, message: str, now: datetime
) -> RLJobStatus:
    return status.model_copy(update={"conditions": set_condition(status.conditions, kind, value, reason, message, now)})


def without_running(status: RLJobStatus, reason: ConditionReason, message: str, now: datetime) -> RLJobStatus:
    """Running turns False (when the condition exists at all)."""
    if find_condition(status.conditions, ConditionType.RUNNING) is None:
        return status
    return with_condition(status, ConditionType.RUNNING, False, reason, message, now)
