"""The decisions of the reconcile loop, pass by pass, as pure functions of the observed state and `now`.

The job in these tests (conftest.base_spec) has runPolicy maxRestarts 2 and backoffSeconds 10, so
the first restart waits 10 s and the second 2 * 10 = 20 s.
"""

import copy
import json
import shlex

import yaml

from kuberl.api.enums import ConditionReason, ConditionType
from kuberl.api.status import RLJobStatus
from kuberl.operator.decide import (
    KUBERAY_RETRY_SECONDS,
    Event,
    apply_failed,
    backoff_seconds,
    decide,
    transition_events,
)
from kuberl.operator.status import status_manifest, with_condition
from tests.unit.operator.conftest import SETTINGS, UID, World, at, base_spec, make_rljob


def started(world: World) -> World:
    world.step(at(0))
    return world


def running(world: World) -> World:
    started(world)
    world.kuberay("tiny-grpo-0", "Running", "RUNNING", dashboardURL="tiny-grpo-0-head-svc:8265")
    world.step(at(1))
    return world


def rayjob_names(world: World) -> list[str]:
    return sorted(world.rayjobs)


def spec_in_configmap(world: World) -> dict:
    assert world.configmap is not None
    return yaml.safe_load(world.configmap["data"]["rljob.yaml"])["spec"]


# --- first start and crash safety -------------------------------------------------------------------


def test_the_first_pass_names_the_rayjob_in_status_and_creates_it_with_its_configmap(world: World):
    decision = world.step(at(0))
    assert decision.write_status
    assert world.status["rayJobName"] == "tiny-grpo-0"
    assert world.status["phase"] == "Starting"
    assert world.status["startTime"] == "2025-01-01T12:00:00Z"
    assert [child["kind"] for child in decision.apply] == [
        "ServiceAccount",  # the job's own identity, Ray token and NetworkPolicy (access.py) come first,
        "Role",
        "RoleBinding",
        "Secret",
        "NetworkPolicy",
        "ConfigMap",  # then the runtime's report and the spec the RayJob mounts
        "ConfigMap",
        "RayJob",
    ]
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_created_turns_true_only_once_the_rayjob_is_seen_to_exist(world: World):
    world.step(at(0), crash_after_status=True)  # named in status; the create never happened
    assert world.condition("Created") is None
    world.step(at(1))  # creates it
    assert world.condition("Created") is None
    decision = world.step(at(2))  # sees it
    assert world.condition("Created") == {
        "type": "Created",
        "status": "True",
        "reason": "RayJobCreated",
        "message": "created RayJob tiny-grpo-0",
        "lastTransitionTime": "2025-01-01T12:00:02Z",
    }
    assert [event.reason for event in decision.events] == ["RayJobCreated"]


def test_a_refused_child_is_a_created_false_condition_with_the_api_servers_words():
    status = with_condition(
        RLJobStatus(), ConditionType.CREATED, True, ConditionReason.RAYJOB_CREATED, "created RayJob tiny-grpo-0", at(0)
    )
    failed = apply_failed(status, "RayJob", "tiny-grpo-1", "exceeded quota: gpus, requested: 8, limited: 4", at(5))
    (created,) = status_manifest(failed)["conditions"]
    assert (created["status"], created["reason"]) == ("False", "ApplyFailed")
    assert (
        created["message"]
        == "the API server refused RayJob tiny-grpo-1: exceeded quota: gpus, requested: 8, limited: 4"
    )
    (event,) = transition_events(status, failed)
    assert (event.type, event.reason) == ("Warning", "ApplyFailed")


def test_a_missing_kuberay_is_a_condition_that_says_what_to_install_and_is_looked_at_again(world: World):
    world.kuberay_missing = True
    decision = world.step(at(0))
    created = world.condition("Created")
    assert created is not None and (created["status"], created["reason"]) == ("False", "KubeRayMissing")
    assert "install KubeRay" in created["message"]
    assert decision.apply == () and decision.requeue_after == KUBERAY_RETRY_SECONDS
    assert world.status["phase"] == "Pending"
    world.kuberay_missing = False  # installed meanwhile
    world.step(at(30))
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_a_crash_after_naming_the_rayjob_creates_exactly_that_rayjob_next_pass(world: World):
    world.step(at(0), crash_after_status=True)
    assert world.rayjobs == {}
    decision = world.step(at(1))
    assert [child["metadata"]["name"] for child in decision.apply][-2:] == ["tiny-grpo-spec", "tiny-grpo-0"]
    assert world.status["rayJobName"] == "tiny-grpo-0"
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_a_pass_with_nothing_new_writes_and_creates_nothing(world: World):
    started(world)
    world.step(at(4))  # sees the RayJob: Created=True
    decision = world.step(at(5))
    assert (decision.write_status, decision.apply, decision.delete_rayjobs, decision.events) == (False, (), (), ())


def test_observed_generation_follows_metadata_generation(world: World):
    world.rljob["metadata"]["generation"] = 7
    world.step(at(0))
    assert world.status["observedGeneration"] == 7


def test_a_rayjob_that_vanished_is_created_again_under_the_same_name(world: World):
    running(world)
    del world.rayjobs["tiny-grpo-0"]
    world.step(at(2))
    assert rayjob_names(world) == ["tiny-grpo-0"]
    assert world.status["phase"] == "Starting"


def test_rayjobs_of_the_job_other_than_the_current_one_are_deleted(world: World):
    started(world)
    world.rayjobs["tiny-grpo-7"] = copy.deepcopy(world.rayjobs["tiny-grpo-0"]) | {
        "metadata": {
            **world.rayjobs["tiny-grpo-0"]["metadata"],
            "name": "tiny-grpo-7",
        }
    }
    decision = world.step(at(1))
    assert decision.delete_rayjobs == ("tiny-grpo-7",)


def test_a_rayjob_left_by_a_deleted_rljob_of_the_same_name_is_waited_for_not_adopted():
    old = World(rljob=make_rljob(uid="old-uid"))
    old.step(at(0))
    world = World(rljob=make_rljob(uid="new-uid"), rayjobs=dict(old.rayjobs))
    decision = world.step(at(1))
    assert decision.apply == ()
    assert decision.delete_rayjobs == ()
    assert decision.requeue_after == 2.0


# --- following KubeRay -------------------------------------------------------------------------------


def test_an_initializing_rayjob_keeps_the_job_starting(world: World):
    started(world)
    world.kuberay("tiny-grpo-0", "Initializing")
    world.step(at(1))
    assert world.status["phase"] == "Starting"


def test_a_running_rayjob_makes_the_job_running_with_its_dashboard(world: World):
    running(world)
    assert world.status["phase"] == "Running"
    assert world.status["dashboardUrl"] == "tiny-grpo-0-head-svc:8265"
    assert world.condition("Running")["status"] == "True"


def test_success_is_final_and_sets_the_completion_time(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Complete", "SUCCEEDED")
    decision = world.step(at(30))
    assert world.status["phase"] == "Succeeded"
    assert world.status["completionTime"] == "2025-01-01T12:00:30Z"
    assert world.condition("Running")["status"] == "False"
    assert Event("Normal", "RayJobSucceeded", "RayJob tiny-grpo-0 succeeded") in decision.events
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(40))
    assert world.status["phase"] == "Succeeded"


def test_a_rayjob_kuberay_refused_fails_the_job_with_kuberays_words_and_no_restart(world: World):
    started(world)
    why = (
        "The RayJob spec is invalid: RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, but "
        "GcsFaultToleranceOptions is not set"
    )  # KubeRay 1.6.2's words (utils/validation.go ValidateRayClusterSpec)
    world.kuberay("tiny-grpo-0", "ValidationFailed", reason="ValidationFailed", message=why)
    decision = world.step(at(5))
    assert world.status["phase"] == "Failed" and world.status["restarts"] == 0
    failed = world.condition("Failed")
    assert (failed["status"], failed["reason"]) == ("True", "KubeRayRefused")
    assert f"KubeRay refused RayJob tiny-grpo-0 (ValidationFailed: {why})" in failed["message"]
    assert any(event.type == "Warning" and event.reason == "KubeRayRefused" for event in decision.events)
    world.step(at(500))
    assert rayjob_names(world) == ["tiny-grpo-0"]  # no restart, ever


# --- failures, backoff and restarts ---------------------------------------------------------------------


def test_backoff_doubles_per_restart():
    assert [backoff_seconds(10, restarts) for restarts in range(4)] == [10, 20, 40, 80]
    assert backoff_seconds(30, 1000) == 86400


def test_a_failure_waits_out_the_backoff_before_restarting(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    decision = world.step(at(100))
    assert world.status["phase"] == "Restarting"
    assert world.condition("Restarting")["status"] == "True"
    assert decision.requeue_after == 10
    decision = world.step(at(105))
    assert decision.apply == ()
    assert decision.requeue_after == 5
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_after_the_backoff_a_new_rayjob_resumes_from_the_checkpoint(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(100))
    world.step(at(110))  # deletes tiny-grpo-0; its successor waits until it is gone
    assert rayjob_names(world) == []
    world.step(at(112))
    assert rayjob_names(world) == ["tiny-grpo-1"]
    assert world.status["restarts"] == 1
    assert world.status["rayJobName"] == "tiny-grpo-1"
    assert world.status["phase"] == "Starting"
    assert "--resume" in shlex.split(world.rayjobs["tiny-grpo-1"]["spec"]["entrypoint"])
    assert world.rayjobs["tiny-grpo-1"]["metadata"]["labels"]["kuberl.io/restart"] == "1"
    assert world.condition("Restarting")["reason"] == "RestartedFromCheckpoint"


def test_the_second_restart_waits_twice_as_long(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(100))
    world.step(at(110))
    world.step(at(112))
    world.kuberay("tiny-grpo-1", "Failed", "FAILED")
    assert world.step(at(200)).requeue_after == 20
    world.step(at(219))
    assert rayjob_names(world) == ["tiny-grpo-1"]
    world.step(at(220))
    world.step(at(222))  # the next pass: the old RayJob is gone
    assert rayjob_names(world) == ["tiny-grpo-2"]
    assert world.status["restarts"] == 2


def test_the_job_fails_when_max_restarts_are_used_up(world: World):
    running(world)
    for index, moment in ((0, 100), (1, 200)):
        world.kuberay(f"tiny-grpo-{index}", "Failed", "FAILED")
        world.step(at(moment))
        world.step(at(moment + 60))
        world.step(at(moment + 62))  # the next pass: the old RayJob is gone
    world.kuberay("tiny-grpo-2", "Failed", "FAILED")
    decision = world.step(at(300))
    assert world.status["phase"] == "Failed"
    assert world.status["restarts"] == 2
    assert world.status["completionTime"] == "2025-01-01T12:05:00Z"
    assert world.condition("Failed")["reason"] == "MaxRestartsExceeded"
    assert decision.apply == ()
    assert any(event.type == "Warning" and event.reason == "MaxRestartsExceeded" for event in decision.events)


def test_max_restarts_zero_fails_on_the_first_failure():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"] = {"maxRestarts": 0}
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(10))
    assert world.status["phase"] == "Failed"


def test_zero_backoff_restarts_in_the_same_pass():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"] = {"maxRestarts": 3, "backoffSeconds": 0}
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(10))
    world.step(at(12))  # the next pass: the old RayJob is gone
    assert rayjob_names(world) == ["tiny-grpo-1"]


def test_a_preempted_runtime_exit_75_restarts_like_any_failure(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED", reason="AppFailed", message="job exited with code 75")
    world.step(at(100))
    assert "exited with code 75" in world.condition("Restarting")["message"]
    world.step(at(110))
    world.step(at(112))  # the next pass: the old RayJob is gone
    assert rayjob_names(world) == ["tiny-grpo-1"]


def test_a_crash_after_committing_a_restart_never_restarts_twice(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(100))
    world.step(at(110), crash_after_status=True)
    assert world.status["restarts"] == 1
    world.step(at(111))
    world.step(at(113))
    assert world.status["restarts"] == 1
    assert rayjob_names(world) == ["tiny-grpo-1"]


def test_restarts_are_evented(world: World):
    running(world)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    backoff = world.step(at(100))
    restart = world.step(at(110))
    assert [(e.type, e.reason) for e in backoff.events] == [("Warning", "BackoffBeforeRestart")]
    assert [(e.type, e.reason) for e in restart.events] == [("Normal", "RestartedFromCheckpoint")]


# --- suspend -------------------------------------------------------------------------------------------


def test_suspend_deletes_the_rayjob_and_keeps_the_spec(world: World):
    running(world)
    world.edit_spec({"runPolicy": {"suspend": True}})
    decision = world.step(at(10))
    assert decision.delete_rayjobs == ("tiny-grpo-0",)
    assert world.rayjobs == {}
    assert world.configmap is not None
    assert world.status["phase"] == "Suspended"
    assert world.condition("Suspended")["status"] == "True"


def test_unsuspend_resumes_from_the_checkpoint_in_a_new_rayjob(world: World):
    running(world)
    world.edit_spec({"runPolicy": {"suspend": True}})
    world.step(at(10))
    world.edit_spec({"runPolicy": {"suspend": False}})
    world.step(at(20))
    assert rayjob_names(world) == ["tiny-grpo-1"]
    assert "--resume" in world.rayjobs["tiny-grpo-1"]["spec"]["entrypoint"]
    assert world.status["restarts"] == 0
    assert world.condition("Suspended")["reason"] == "ResumedByUser"


def test_a_job_created_suspended_starts_only_when_unsuspended():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"]["suspend"] = True
    world.step(at(0))
    assert (world.rayjobs, world.status["phase"]) == ({}, "Suspended")
    world.edit_spec({"runPolicy": {"suspend": False}})
    world.step(at(5))
    assert rayjob_names(world) == ["tiny-grpo-0"]
    assert "--resume" not in world.rayjobs["tiny-grpo-0"]["spec"]["entrypoint"]


# --- deadline and TTL ----------------------------------------------------------------------------------


def test_the_deadline_is_waited_for_then_fails_the_job_and_deletes_the_rayjob():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"]["activeDeadlineSeconds"] = 3600
    running(world)
    assert world.step(at(600)).requeue_after == 3000
    decision = world.step(at(3600))
    assert world.status["phase"] == "Failed"
    assert world.condition("Failed")["reason"] == "DeadlineExceeded"
    assert decision.delete_rayjobs == ("tiny-grpo-0",)


def test_suspended_time_does_not_count_towards_the_deadline():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"]["activeDeadlineSeconds"] = 3600
    running(world)  # started at 0
    world.step(at(1000))  # 1000 s of the 3600 used
    world.edit_spec({"runPolicy": {"suspend": True}})
    world.step(at(1000))
    assert world.status["phase"] == "Suspended"
    world.edit_spec({"runPolicy": {"suspend": False}})
    world.step(at(6000))  # 5000 s suspended, longer than the whole deadline
    assert world.status["phase"] == "Starting" and world.status["suspendedSeconds"] == 5000
    decision = world.step(at(6001))
    assert world.status["phase"] != "Failed" and decision.requeue_after == 3600 + 5000 - 6001
    world.edit_spec({"runPolicy": {"suspend": True}})  # a second suspension adds up
    world.step(at(7000))
    world.edit_spec({"runPolicy": {"suspend": False}})
    world.step(at(8000))
    assert world.status["suspendedSeconds"] == 6000
    world.step(at(9599))
    assert world.status["phase"] != "Failed"  # 9599 - 6000 = 3599 s active
    world.step(at(9600))
    assert world.status["phase"] == "Failed" and world.condition("Failed")["reason"] == "DeadlineExceeded"


def test_a_job_created_suspended_starts_its_deadline_when_it_starts():
    spec = base_spec()
    spec["runPolicy"] = {**spec["runPolicy"], "suspend": True, "activeDeadlineSeconds": 100}
    world = World(rljob=make_rljob(spec))
    world.step(at(0))
    world.edit_spec({"runPolicy": {"suspend": False}})
    world.step(at(1000))
    assert world.status["startTime"] == "2025-01-01T12:16:40Z" and "suspendedSeconds" not in world.status
    assert world.step(at(1001)).requeue_after == 99


def test_the_ttl_deletes_the_finished_job_when_it_is_up():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 60
    running(world)
    world.kuberay("tiny-grpo-0", "Complete", "SUCCEEDED")
    # the pass that finishes the job schedules the TTL pass itself (no later event is promised)
    assert world.step(at(100)).requeue_after == 60
    decision = world.step(at(130))
    assert (decision.delete_rljob, decision.requeue_after) == (False, 30)
    assert world.step(at(160)).delete_rljob


# --- spec changes -------------------------------------------------------------------------------------


def test_a_safe_spec_change_restarts_from_the_checkpoint_with_the_new_spec(world: World):
    running(world)
    world.edit_spec({"rollout": {"temperature": 0.5}})
    decision = world.step(at(10))
    world.step(at(12))  # the next pass: the old RayJob is gone
    assert rayjob_names(world) == ["tiny-grpo-1"]
    assert "--resume" in world.rayjobs["tiny-grpo-1"]["spec"]["entrypoint"]
    assert spec_in_configmap(world)["rollout"] == {"temperature": 0.5}
    assert world.status["restarts"] == 0
    assert any(event.reason == "SpecChanged" for event in decision.events)


def test_an_unsafe_spec_change_is_refused_and_the_running_job_is_left_alone(world: World):
    running(world)
    world.edit_spec({"models": {"actor": {"path": "hf://org/another-model"}}})
    decision = world.step(at(10))
    refused = world.condition("SpecChangeRefused")
    assert (refused["status"], refused["reason"]) == ("True", "UnsafeSpecChange")
    assert "spec.models.actor.path" in refused["message"]
    assert rayjob_names(world) == ["tiny-grpo-0"]
    assert spec_in_configmap(world)["models"]["actor"]["path"] == "hf://org/actor"
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "UnsafeSpecChange")]
    assert world.step(at(20)).events == ()


def test_reverting_a_refused_change_clears_the_refusal(world: World):
    running(world)
    world.edit_spec({"algorithm": {"name": "rloo"}})
    world.step(at(10))
    world.edit_spec({"algorithm": {"name": "grpo"}})
    world.step(at(20))
    assert world.condition("SpecChangeRefused")["status"] == "False"
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_a_run_policy_change_does_not_restart_the_rayjob(world: World):
    running(world)
    world.edit_spec({"runPolicy": {"maxRestarts": 9}})
    decision = world.step(at(10))
    assert (decision.apply, decision.delete_rayjobs) == ((), ())
    assert world.status["observedGeneration"] == 2


def test_an_unsafe_change_made_while_suspended_resumes_the_spec_that_ran(world: World):
    running(world)
    world.edit_spec({"runPolicy": {"suspend": True}})
    world.step(at(10))
    world.edit_spec({"runPolicy": {"suspend": False}, "models": {"actor": {"path": "hf://org/other"}}})
    world.step(at(20))
    assert rayjob_names(world) == ["tiny-grpo-1"]
    assert spec_in_configmap(world)["models"]["actor"]["path"] == "hf://org/actor"
    assert world.condition("SpecChangeRefused")["status"] == "True"


def test_an_invalid_spec_creates_nothing_and_says_why():
    world = World(rljob=make_rljob())
    world.rljob["spec"]["algorithm"] = {"name": "ppo"}  # gae without a critic: the webhook would have refused it
    decision = world.step(at(0))
    assert decision.apply == ()
    assert world.status["phase"] == "Pending"
    created = world.condition("Created")
    assert (created["status"], created["reason"]) == ("False", "InvalidSpec")
    assert "spec.models.critic" in created["message"]


def test_a_malformed_pod_template_past_the_webhook_is_an_invalid_spec_not_a_failing_pass():
    world = World(rljob=make_rljob())
    template = {"spec": {"containers": [{"name": {"a": 1}}]}}  # a container name that is a map
    world.rljob["spec"]["resources"] = {"head": {"podTemplate": template}}
    decision = world.step(at(0))  # raised TypeError (merging containers by name), on every retry
    assert decision.apply == ()
    created = world.condition("Created")
    assert (created["status"], created["reason"]) == ("False", "InvalidSpec")
    assert "spec.resources.head.podTemplate.spec.containers[0].name: expected a string" in created["message"]


def test_an_invalid_edit_of_a_running_job_is_refused_and_the_job_keeps_running(world: World):
    running(world)
    world.edit_spec({"algorithm": {"name": "ppo"}})
    world.step(at(10))
    assert world.condition("SpecChangeRefused")["reason"] == "InvalidSpec"
    assert world.status["phase"] == "Running"
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_decide_reads_no_clock():
    observed = World(rljob=make_rljob()).observed()
    assert decide(observed, at(0), SETTINGS) == decide(observed, at(0), SETTINGS)


# --- the runtime's report --------------------------------------------------------------------------


def report(**fields: object) -> dict:
    owner = {"uid": UID, "controller": True}
    return {
        "metadata": {"name": "tiny-grpo-progress", "ownerReferences": [owner]},
        "data": {"report.json": json.dumps(fields)},
    }


def test_the_runtimes_report_becomes_progress_metrics_and_last_checkpoint(world: World):
    running(world)
    last = {"step": 20, "uri": "s3://ckpt/step-20", "time": "2025-01-01T12:10:00Z"}
    world.progress = report(progress={"step": 20, "totalSteps": 60}, metrics={"rewardMean": 0.5}, lastCheckpoint=last)
    decision = world.step(at(5))
    assert decision.write_status and decision.events == ()
    assert world.status["progress"] == {"step": 20, "totalSteps": 60, "epoch": 0}
    assert world.status["metrics"] == {"rewardMean": 0.5}
    assert world.status["lastCheckpoint"] == last


def test_a_report_cannot_move_a_phase_a_condition_a_name_or_a_time(world: World):
    running(world)
    before = copy.deepcopy(world.status)
    world.progress = report(
        progress={"step": 3},
        phase="Failed",
        rayJobName="victim-7",
        completionTime="2000-01-01T00:00:00Z",
        conditions=[{"type": "Failed", "status": "True"}],
    )
    world.step(at(5))  # a report with fields the model does not know is refused as a whole
    assert world.status == before
    world.progress = report(progress={"step": -4})
    world.step(at(6))  # and so is one out of range
    assert world.status == before
    world.progress = report(progress={"step": 4})
    world.step(at(7))
    assert {key: value for key, value in world.status.items() if key not in ("progress", "metrics")} == before
    assert world.status["progress"]["step"] == 4


def test_a_run_that_reported_a_configuration_error_fails_the_job_without_a_restart(world: World):
    running(world)
    why = "spec.data.train: /data/train.jsonl does not exist; mount it or use an s3:// location"
    world.progress = report(progress={"step": 0}, rayjob="tiny-grpo-0", configurationError=why)
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(100))
    assert world.status["phase"] == "Failed" and world.status["restarts"] == 0
    failed = world.condition("Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidConfiguration")
    assert failed["message"] == f"RayJob tiny-grpo-0 cannot run as specified: {why}"
    world.step(at(200))
    assert rayjob_names(world) == ["tiny-grpo-0"]  # no restart, ever


def test_a_configuration_error_of_an_earlier_rayjob_does_not_stop_a_restart_of_this_one(world: World):
    running(world)
    world.progress = report(rayjob="tiny-grpo-7", configurationError="an old verdict, for another RayJob")
    world.kuberay("tiny-grpo-0", "Failed", "FAILED")
    world.step(at(100))
    assert world.status["phase"] == "Restarting"
    world.step(at(110))
    world.step(at(112))  # the next pass: the old RayJob is gone
    assert rayjob_names(world) == ["tiny-grpo-1"]


# --- names held by someone else ------------------------------------------------------------------


def test_a_configmap_of_the_jobs_name_that_is_not_its_own_is_neither_read_nor_adopted(world: World):
    world.configmap = {"metadata": {"name": "tiny-grpo-spec"}, "data": {"rljob.yaml": "spec: {}"}}  # no owner
    decision = world.step(at(0))
    assert decision.apply == () and decision.requeue_after == 30
    created = world.condition("Created")
    assert created is not None and (created["status"], created["reason"]) == ("False", "NameTaken")
    assert "ConfigMap named tiny-grpo-spec exists and does not belong to this RLJob" in created["message"]
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "NameTaken")]
    world.configmap = None  # its owner removed it
    world.step(at(30))
    assert rayjob_names(world) == ["tiny-grpo-0"]


def test_the_reported_validation_scores_reach_the_status(world: World):
    running(world)
    scores = {"step": 2, "samples": 4, "greedyMean": 0.5, "meanAtK": 0.25}
    world.progress = report(progress={"step": 3}, validation=scores)
    world.step(at(5))
    assert world.status["validation"] == scores
    world.progress = report(progress={"step": 4})  # a report without scores keeps the last ones
    world.step(at(6))
    assert world.status["validation"] == scores


def test_the_next_rayjob_waits_until_the_previous_one_and_its_pods_are_gone(world: World):
    """Two runtimes never share a checkpoint location: the old RayJob is deleted in the foreground, and the
    next is created only once the old one (kept while its pods stop) no longer exists."""
    running(world)
    world.pods_stopping.add("tiny-grpo-0")
    world.edit_spec({"rollout": {"temperature": 0.5}})
    first = world.step(at(10))
    assert first.delete_rayjobs == ("tiny-grpo-0",)
    assert not any(child["kind"] == "RayJob" for child in first.apply)
    assert first.requeue_after == 2.0
    assert world.status["rayJobName"] == "tiny-grpo-1"  # named first: a crash now never makes two
    assert world.condition("Running")["reason"] == "WaitingForPreviousRayJob"
    assert "tiny-grpo-0" in world.condition("Running")["message"]
    for moment in (12, 14, 16):  # its pods take a while
        assert not any(child["kind"] == "RayJob" for child in world.step(at(moment)).apply)
        assert rayjob_names(world) == ["tiny-grpo-0"]
    world.pods_stopping.clear()
    world.step(at(18))  # deletes it again: now it goes
    assert rayjob_names(world) == []
    world.step(at(20))
    assert rayjob_names(world) == ["tiny-grpo-1"]
    assert world.status["restarts"] == 0
