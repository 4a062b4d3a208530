"""Pure status pieces: what a KubeRay RayJob's status means for the job, and Kubernetes-style conditions.

KubeRay reports `status.jobDeploymentStatus` (New, Initializing, Running, Complete, Failed,
Suspending, Suspended, Retrying, Waiting, ValidationFailed) and `status.jobStatus` (PENDING, RUNNING, STOPPED,
SUCCEEDED, FAILED). `rayjob_state` folds them, and the RayJob's `spec.suspend` (which only Kueue
moves: the operator sets it once, at creation, on a queued job), into the states the operator acts on. A
condition's `lastTransitionTime` moves only when its status flips; reason and message may change
without a flip. Times are RFC 3339 strings with second precision, as Kubernetes writes them.
"""

import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kuberl.api.enums import ConditionReason, ConditionStatus, ConditionType, Phase
from kuberl.api.status import REPORT_KEY, RuntimeReport


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


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: an offset that moves year 1 or 9999 out of range
        return None


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


Condition = dict[str, str]


def find_condition(conditions: tuple[Condition, ...], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.get("type") == kind.value), None)


def is_true(conditions: tuple[Condition, ...], kind: ConditionType) -> bool:
    found = find_condition(conditions, kind)
    return found is not None and found.get("status") == ConditionStatus.TRUE.value


def set_condition(
    conditions: tuple[Condition, ...],
    kind: ConditionType,
    status: bool,
    reason: ConditionReason,
    message: str,
    now: datetime,
) -> tuple[Condition, ...]:
    """The conditions with `kind` set; its lastTransitionTime moves only when its status flips (or it is new)."""
    value = ConditionStatus.TRUE.value if status else ConditionStatus.FALSE.value
    old = find_condition(conditions, kind)
    moved = old is None or old.get("status") != value or not old.get("lastTransitionTime")
    new = {
        "type": kind.value,
        "status": value,
        "reason": reason.value,
        "message": message,
        "lastTransitionTime": format_time(now) if moved else old["lastTransitionTime"],  # type: ignore[index]
    }
    if old is None:
        return (*conditions, new)
    return tuple(new if c is old else c for c in conditions)


def flipped(before: tuple[Condition, ...], after: tuple[Condition, ...]) -> list[Condition]:
    """Conditions of `after` that are new or whose status differs from `before`."""
    old = {c.get("type"): c.get("status") for c in before}
    return [c for c in after if old.get(c["type"]) != c["status"]]


def _phase(value: object) -> Phase:
    try:
        return Phase(str(value))
    except ValueError:
        return Phase.PENDING


@dataclass(frozen=True)
class OperatorStatus:
    """The operator-owned part of an RLJob's status, as written (camelCase on the wire)."""

    phase: Phase = Phase.PENDING
    conditions: tuple[Condition, ...] = field(default_factory=tuple)
    observed_generation: int | None = None
    ray_job_name: str | None = None
    dashboard_url: str | None = None
    restarts: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    suspended_seconds: int = 0  # time spent suspended, added up at each resume
    progress: dict[str, Any] | None = None  # from the runtime's report (validated: read_report)
    metrics: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    last_checkpoint: dict[str, Any] | None = None
    exported_model: str | None = None

    @classmethod
    def from_status(cls, status: dict[str, Any] | None) -> "OperatorStatus":
        status = status or {}
        conditions = tuple(dict(c) for c in status.get("conditions") or () if isinstance(c, dict) and "type" in c)
        return cls(
            phase=_phase(status.get("phase", Phase.PENDING.value)),
            conditions=conditions,
            observed_generation=status.get("observedGeneration"),
            ray_job_name=status.get("rayJobName"),
            dashboard_url=status.get("dashboardUrl"),
            restarts=int(status.get("restarts") or 0),
            start_time=status.get("startTime"),
            completion_time=status.get("completionTime"),
            suspended_seconds=int(status.get("suspendedSeconds") or 0),
            progress=status.get("progress"),
            metrics=status.get("metrics"),
            validation=status.get("validation"),
            last_checkpoint=status.get("lastCheckpoint"),
            exported_model=status.get("exportedModel"),
        )

    def to_status(self) -> dict[str, Any]:
        """The fields to apply; absent ones are left out, so server-side apply removes them if they were ours."""
        full: dict[str, Any] = {
            "phase": self.phase.value,
            "conditions": [dict(c) for c in self.conditions],
            "observedGeneration": self.observed_generation,
            "rayJobName": self.ray_job_name,
            "dashboardUrl": self.dashboard_url,
            "restarts": self.restarts,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "suspendedSeconds": self.suspended_seconds or None,
            "progress": self.progress,
            "metrics": self.metrics,
            "validation": self.validation,
            "lastCheckpoint": self.last_checkpoint,
            "exportedModel": self.exported_model,
        }
        return {key: value for key, value in full.items() if value is not None}

    def with_report(self, report: RuntimeReport) -> "OperatorStatus":
        """The runtime's progress, metrics, validation, last checkpoint and exported model, validated; the rest
        stays the operator's."""
        checkpoint = report.last_checkpoint.to_manifest() if report.last_checkpoint is not None else None
        validation = report.validation.to_manifest() if report.validation is not None else None
        return replace(
            self,
            progress=report.progress.to_manifest(),
            metrics=report.metrics.to_manifest(),
            validation=validation or self.validation,
            last_checkpoint=checkpoint or self.last_checkpoint,
            exported_model=report.exported_model or self.exported_model,
        )

    def with_condition(
        self, kind: ConditionType, status: bool, reason: ConditionReason, message: str, now: datetime
    ) -> "OperatorStatus":
        return replace(self, conditions=set_condition(self.conditions, kind, status, reason, message, now))

    def without_running(self, reason: ConditionReason, message: str, now: datetime) -> "OperatorStatus":
        """Running turns False (when the condition exists at all)."""
        if find_condition(self.conditions, ConditionType.RUNNING) is None:
            return self
        return self.with_condition(ConditionType.RUNNING, False, reason, message, now)
