"""Jobs in a Kueue queue (spec.queueName): created suspended, left to Kueue's admission and preemption.

Kueue's side is played by the tests: admitting a RayJob is setting its `spec.suspend` to false,
preempting it is setting it to true again; KubeRay's side by `world.kuberay(...)` as elsewhere.
"""

import pytest

from kuberl.api import parse_rljob
from kuberl.operator.builders import Owner, build_rayjob, kueue_labels
from tests.unit.operator.conftest import UID, World, at, base_spec, make_rljob

QUEUE = "team-a-gpus"


@pytest.fixture
def queued() -> World:
    spec = {**base_spec(), "queueName": QUEUE, "workloadPriorityClass": "research-high"}
    return World(rljob=make_rljob(spec))


def kueue_sets_suspend(world: World, name: str, suspend: bool) -> None:
    world.rayjobs[name]["spec"]["suspend"] = suspend


def admitted_and_running(world: World) -> World:
    world.step(at(0))
    kueue_sets_suspend(world, "tiny-grpo-0", False)
    world.kuberay("tiny-grpo-0", "Running", "RUNNING")
    world.step(at(10))
    return world


def test_the_rayjob_carries_the_queue_labels_and_is_created_suspended(queued: World):
    decision = queued.step(at(0))
    (rayjob,) = [child for child in decision.apply if child["kind"] == "RayJob"]
    labels = rayjob["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == QUEUE
    assert labels["kueue.x-k8s.io/priority-class"] == "research-high"
    assert rayjob["spec"]["suspend"] is True
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True  # Kueue admits no RayJob that keeps its cluster
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is False  # nor one with an autoscaler


def test_a_job_without_a_queue_has_no_kueue_labels_and_starts_unsuspended():
    job = parse_rljob(make_rljob())
    rayjob = build_rayjob(job, Owner("tiny-grpo", "team-a", UID), 0, default_image="img", generation=1)
    assert kueue_labels(job) == {}
    assert "suspend" not in rayjob["spec"]
    assert not any(label.startswith("kueue.x-k8s.io/") for label in rayjob["metadata"]["labels"])


def test_a_job_waiting_for_admission_is_queued(queued: World):
    decision = queued.step(at(0))
    assert queued.status["phase"] == "Queued"
    condition = queued.condition("Queued")
    assert (condition["status"], condition["reason"]) == ("True", "WaitingForAdmission")
    assert QUEUE in condition["message"]
    assert [event.reason for event in decision.events].count("WaitingForAdmission") == 1
    queued.kuberay("tiny-grpo-0", "Suspended")
    later = queued.step(at(30))
    assert queued.status["phase"] == "Queued"
    assert later.apply == () and later.delete_rayjobs == ()  # nothing re-applied: suspend stays Kueue's


def test_admission_starts_the_job_and_clears_queued(queued: World):
    queued.step(at(0))
    kueue_sets_suspend(queued, "tiny-grpo-0", False)
    queued.kuberay("tiny-grpo-0", "Initializing")
    queued.step(at(5))
    assert queued.status["phase"] == "Starting"
    condition = queued.condition("Queued")
    assert (condition["status"], condition["reason"]) == ("False", "Admitted")
    queued.kuberay("tiny-grpo-0", "Running", "RUNNING")
    queued.step(at(10))
    assert queued.status["phase"] == "Running"
    assert queued.condition("Running")["status"] == "True"


def test_a_preemption_queues_the_same_rayjob_again_without_counting_a_restart(queued: World):
    admitted_and_running(queued)
    kueue_sets_suspend(queued, "tiny-grpo-0", True)  # Kueue preempts; KubeRay has not reacted yet
    decision = queued.step(at(20))
    assert queued.status["phase"] == "Queued"
    condition = queued.condition("Queued")
    assert (condition["status"], condition["reason"]) == ("True", "Preempted")
    assert "resumes from the latest checkpoint" in condition["message"]
    assert queued.condition("Running")["status"] == "False"
    assert decision.apply == () and decision.delete_rayjobs == ()
    queued.kuberay("tiny-grpo-0", "Suspended")
    queued.step(at(25))
    assert queued.condition("Queued")["reason"] == "Preempted"  # the reason of the hold stays
    kueue_sets_suspend(queued, "tiny-grpo-0", False)  # admitted again: KubeRay runs the entrypoint anew
    queued.kuberay("tiny-grpo-0", "Running", "RUNNING")
    queued.step(at(40))
    assert (queued.status["phase"], queued.status["rayJobName"], queued.status["restarts"]) == (
        "Running",
        "tiny-grpo-0",
        0,
    )
    assert list(queued.rayjobs) == ["tiny-grpo-0"]


def test_a_restart_of_a_queued_job_queues_its_new_rayjob(queued: World):
    admitted_and_running(queued)
    queued.kuberay("tiny-grpo-0", "Failed", "FAILED")
    queued.step(at(20))
    queued.step(at(40))  # after the 10 s backoff
    queued.step(at(42))  # the next pass: the old RayJob is gone
    assert queued.status["rayJobName"] == "tiny-grpo-1"
    assert queued.rayjobs["tiny-grpo-1"]["spec"]["suspend"] is True
    assert queued.status["phase"] == "Queued"
    assert queued.condition("Queued")["reason"] == "WaitingForAdmission"


def test_suspending_a_queued_job_leaves_the_queue(queued: World):
    queued.step(at(0))
    queued.edit_spec({"runPolicy": {"suspend": True}})
    queued.step(at(5))
    assert queued.status["phase"] == "Suspended"
    assert queued.rayjobs == {}
    assert queued.condition("Queued")["status"] == "False"


def test_a_queued_rayjob_that_vanished_is_created_suspended_again(queued: World):
    admitted_and_running(queued)
    del queued.rayjobs["tiny-grpo-0"]
    queued.step(at(20))
    assert queued.rayjobs["tiny-grpo-0"]["spec"]["suspend"] is True
    assert queued.status["phase"] == "Queued"
