"""KubeRay's status folded into the operator's states, and conditions that keep their transition time."""

import pytest

from kuberl.api.enums import ConditionReason, ConditionType, Phase
from kuberl.api.status import Condition, RLJobStatus
from kuberl.operator.status import (
    RAYJOB_MESSAGE_LIMIT,
    RayJobState,
    flipped,
    rayjob_message,
    rayjob_state,
    read_report,
    read_status,
    set_condition,
    status_manifest,
    with_report,
)
from tests.unit.operator.conftest import at


def wire(conditions: list[Condition]) -> list[dict]:
    """The conditions as the status carries them to the API server."""
    return status_manifest(RLJobStatus(conditions=conditions))["conditions"]


S, R, OK, F = RayJobState.STARTING, RayJobState.RUNNING, RayJobState.SUCCEEDED, RayJobState.FAILED
Q, NO = RayJobState.QUEUED, RayJobState.REFUSED


@pytest.mark.parametrize(
    ("deployment", "job", "state"),
    [
        ("", "", S),
        ("New", "", S),
        ("Initializing", "", S),
        ("Waiting", "", S),
        ("Retrying", "", S),
        ("Suspending", "", Q),
        ("Suspended", "", Q),
        ("Running", "PENDING", S),
        ("Running", "", R),
        ("Running", "RUNNING", R),
        ("Complete", "SUCCEEDED", OK),
        ("Complete", "FAILED", F),
        ("Complete", "STOPPED", F),
        ("Failed", "", F),
        ("Failed", "RUNNING", F),
        ("Running", "FAILED", F),
        ("ValidationFailed", "", NO),
    ],
)
def test_rayjob_state(deployment: str, job: str, state: RayJobState):
    assert rayjob_state({"status": {"jobDeploymentStatus": deployment, "jobStatus": job}}) == state


@pytest.mark.parametrize(
    ("deployment", "job", "state"),
    [
        ("", "", Q),  # created suspended: Kueue has not admitted it
        ("Running", "RUNNING", Q),  # Kueue preempts it; KubeRay has not reacted yet
        ("Complete", "SUCCEEDED", OK),  # finished before the suspension: finished it is
        ("Failed", "", F),
        ("ValidationFailed", "", NO),  # KubeRay validates a suspended RayJob too
    ],
)
def test_a_suspended_rayjob_is_queued_unless_it_finished(deployment: str, job: str, state: RayJobState):
    rayjob = {"spec": {"suspend": True}, "status": {"jobDeploymentStatus": deployment, "jobStatus": job}}
    assert rayjob_state(rayjob) == state


def test_a_rayjob_without_status_is_starting():
    assert rayjob_state({"metadata": {"name": "x"}}) == S


def test_rayjob_message_joins_kuberays_reason_and_message():
    assert rayjob_message({"status": {"reason": "AppFailed", "message": "exit code 75"}}) == "AppFailed: exit code 75"
    assert rayjob_message({"status": {}}) == ""


def test_a_long_rayjob_message_keeps_what_failed_and_the_error_at_the_end_of_the_log_without_colour_codes():
    log = "".join(f"\x1b[36m(ModelWorker pid=123)\x1b[0m loading shard {i}\n" for i in range(2000))
    error = (
        "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer. GLHF! \U0001f3d6\ufe0f"
    )
    message = "Job entrypoint command failed with exit code 1, last available logs:\n" + log + error
    shown = rayjob_message({"status": {"reason": "AppFailed", "message": message}})
    assert len(shown) <= RAYJOB_MESSAGE_LIMIT
    assert shown.startswith("AppFailed: Job entrypoint command failed with exit code 1")
    assert shown.endswith(error)
    assert "\x1b" not in shown and "(ModelWorker pid=123) loading shard 1999" in shown


def test_a_new_condition_takes_the_current_time():
    (condition,) = wire(set_condition((), ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, "up", at(0)))
    assert condition == {
        "type": "Running",
        "status": "True",
        "reason": "RayJobRunning",
        "message": "up",
        "lastTransitionTime": "2025-01-01T12:00:00Z",
    }


def test_last_transition_time_stays_when_only_reason_or_message_change():
    first = set_condition((), ConditionType.RESTARTING, True, ConditionReason.BACKOFF, "a", at(0))
    later = wire(set_condition(first, ConditionType.RESTARTING, True, ConditionReason.BACKOFF, "b", at(60)))
    assert later[0]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    assert later[0]["message"] == "b"


def test_last_transition_time_moves_when_the_status_flips():
    first = set_condition((), ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, "", at(0))
    later = wire(set_condition(first, ConditionType.RUNNING, False, ConditionReason.RAYJOB_FAILED, "", at(60)))
    assert later[0]["lastTransitionTime"] == "2025-01-01T12:01:00Z"


def test_setting_one_condition_keeps_the_others_and_their_order():
    conditions = set_condition((), ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, "", at(0))
    conditions = set_condition(conditions, ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, "", at(1))
    conditions = set_condition(conditions, ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, "x", at(2))
    assert [c["type"] for c in wire(conditions)] == ["Created", "Running"]


def test_flipped_lists_new_conditions_and_status_changes_only():
    before = set_condition((), ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, "", at(0))
    after = set_condition(before, ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, "new text", at(1))
    after = set_condition(after, ConditionType.RUNNING, True, ConditionReason.RAYJOB_RUNNING, "", at(1))
    assert [c["type"] for c in wire(flipped(before, after))] == ["Running"]


def test_operator_status_round_trips_and_leaves_out_what_is_unset():
    status = RLJobStatus(phase=Phase.RUNNING, ray_job_name="j-0", restarts=1, observed_generation=2)
    stored = status_manifest(status)
    assert stored == {"phase": "Running", "conditions": [], "observedGeneration": 2, "rayJobName": "j-0", "restarts": 1}
    assert read_status(stored) == status


def test_operator_status_reads_an_unknown_phase_as_pending():
    status = read_status({"phase": "Exploded", "progress": {"step": 3}})
    assert status.phase == Phase.PENDING
    assert status_manifest(status)["progress"] == {"step": 3}  # the operator writes it too, from the runtime's report


def test_a_report_that_is_missing_not_json_or_invalid_is_no_report():
    assert read_report(None) is None
    assert read_report({"data": {}}) is None
    assert read_report({"data": {"report.json": "{not json"}}) is None
    assert read_report({"data": {"report.json": '{"progress": {"step": "many"}}'}}) is None
    assert read_report({"data": {"report.json": '{"progress": {"step": 2}}'}}).progress.step == 2


def test_the_exported_model_the_runtime_reports_reaches_the_status_and_stays() -> None:
    report = read_report({"data": {"report.json": '{"exportedModel": "s3://bucket/jobs/grpo/model"}'}})
    status = with_report(RLJobStatus(phase=Phase.RUNNING), report)
    assert status_manifest(status)["exportedModel"] == "s3://bucket/jobs/grpo/model"
    later = read_report({"data": {"report.json": '{"progress": {"step": 2}}'}})  # a restarted run's first report
    assert with_report(read_status(status_manifest(status)), later).exported_model == ("s3://bucket/jobs/grpo/model")
