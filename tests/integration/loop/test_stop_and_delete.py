"""Stopping a running job on a "cluster" (tests/integration/kuberay_standin.py plays KubeRay and the pods): deleting
the RLJob removes everything it made, suspending it keeps the checkpoints the resumed run continues from, and a spec
change stops it and starts the next RayJob from its checkpoint, only once every pod of the old one is gone, so two
runtimes never write to the job's folder at once. The stand-in records when each pod and driver ran
(`KubeRayStandIn.lifetimes`, each bound erring outwards): that order is read from what happened, not inferred.
"""

import json
import re
import time
import urllib.error

import pytest

from kuberl.api import contract
from kuberl.operator import names
from tests.integration.envtest import wait_until
from tests.integration.kuberay_standin import alive
from tests.integration.loop.conftest import QUICK, STEPS, Loop, committed_steps, short

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Long enough that a run cannot end on its own while a test stops or changes it (steps take 1-2 s here).
ENDLESS = 1000
#: One actor pod beside the head, not the example's two: what these tests stop, resume and change is the job
#: (its RayJobs, ConfigMap, processes and checkpoints), which is the same with one rank; two ranks killed and
#: resumed to the same weights are test_tiny_grpo_cluster.py's, and every pod start costs seconds of both cores.
ONE_ACTOR_POD = {"spec.resources.actor.replicas": 1, **QUICK}
RESUMED = re.compile(r"resumed from the checkpoint of step (\d+)")


def gone(loop: Loop, path: str) -> bool:
    try:
        loop.cp.request("GET", path)
    except urllib.error.HTTPError as error:
        return error.code == 404
    return False


def pods_stop_within(loop: Loop, name: str) -> float:
    """How long the job's stopped RayJob may take to go: its pods' terminationGracePeriodSeconds (the stop window the
    driver saves in, plus api/contract.py's margin), and a minute for the rest. A pod may use all of it: Ray drains
    a node that gets SIGTERM until its workers are gone (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, the stop window).
    Seen once here: an actor pod still draining 120 s after the suspend, its head pod gone (2026-11-29; the cause,
    a drain the ended GCS never answers, is why worker pods now run runtime/podinit.py: the last test below)."""
    (rayjob,) = loop.rayjobs(name).values()
    spec = rayjob["spec"]["rayClusterSpec"]
    templates = [spec["headGroupSpec"]["template"], *(group["template"] for group in spec["workerGroupSpecs"])]
    return max(float(template["spec"]["terminationGracePeriodSeconds"]) for template in templates) + 60


def test_a_suspended_job_resumes_from_its_last_checkpoint_and_deleting_it_mid_run_removes_all_it_made(loop: Loop):
    """One job for both (a job's pods take half a minute to start here): suspended after its first checkpoint, it
    resumes from its last one; deleted once the resumed run trains, its RayJob, ConfigMap and processes go."""
    name = loop.create(
        short("tiny-grpo-cluster.yaml", "tiny-grpo-suspended", **{"spec.training.totalSteps": ENDLESS, **ONE_ACTOR_POD})
    )
    folder = loop.job_folder(name)
    wait_until(lambda: committed_steps(folder), timeout=300, interval=0.1, what="the first checkpoint")

    stopped_within = pods_stop_within(loop, name)
    suspend = {"spec": {"runPolicy": {"suspend": True}}}
    path = names.rljob_path(loop.namespace, name)
    loop.cp.request("PATCH", path, suspend, content_type="application/merge-patch+json")
    loop.wait_phase(name, "Suspended", timeout=60)
    wait_until(lambda: not loop.rayjobs(name), timeout=stopped_within, what="the RayJob gone")
    assert not loop.standin.processes(loop.namespace)
    last = committed_steps(folder)[-1]

    resume = {"spec": {"runPolicy": {"suspend": False}}}
    loop.cp.request("PATCH", path, resume, content_type="application/merge-patch+json")
    # running again: the stopped run's last report (of its save on SIGTERM) may land after its phase, so a step
    # past the last committed checkpoint is the resumed run's
    status = wait_until(
        lambda: (
            (status := loop.rljob(name).get("status") or {}).get("phase") == "Running"
            and status.get("progress", {}).get("step", 0) > last
            and RESUMED.search(loop.standin.driver_log_so_far(loop.namespace, f"{name}-1"))
            and status
        ),
        timeout=300,
        what="the resumed run training",
    )
    assert status["restarts"] == 0  # a resume is no restart
    resumed = RESUMED.search(loop.standin.driver_log_so_far(loop.namespace, f"{name}-1"))
    assert resumed is not None and int(resumed.group(1)) == last > 0, loop.diagnosis(name)
    processes = loop.standin.processes(loop.namespace, f"{name}-1")
    assert processes

    loop.cp.request("DELETE", path)

    wait_until(lambda: not loop.rayjobs(name), timeout=stopped_within, what="the RayJob gone")
    wait_until(
        lambda: gone(loop, names.configmap_path(loop.namespace, names.configmap_name(name))),
        timeout=30,
        what="the spec ConfigMap gone",
    )
    wait_until(lambda: not alive(processes), timeout=30, what="every process of the job's pods gone")


def test_a_spec_change_mid_run_continues_from_the_checkpoint_without_two_runtimes_at_once(loop: Loop):
    name = loop.create(
        short("tiny-grpo-cluster.yaml", "tiny-grpo-changed", **{"spec.training.totalSteps": ENDLESS, **ONE_ACTOR_POD})
    )
    folder = loop.job_folder(name)
    wait_until(lambda: committed_steps(folder), timeout=300, interval=0.1, what="the first checkpoint")

    # a total a checkpoint can follow (api/specdiff.py): a restart, not a refusal; the running RayJob is
    # stopped a step or two later, well before it could reach the new total
    total = STEPS + 4
    path = names.rljob_path(loop.namespace, name)
    loop.cp.request(
        "PATCH", path, {"spec": {"training": {"totalSteps": total}}}, content_type="application/merge-patch+json"
    )
    status = loop.wait_phase(name, "Succeeded", timeout=420)

    assert status["restarts"] == 0, loop.diagnosis(name)  # the user's change is no failure
    assert loop.rayjobs(name).keys() == {f"{name}-1"}, loop.diagnosis(name)
    row = wait_until(
        lambda: (row := loop.printed_row(name))["Step"] == total and row, timeout=30, what="the last step printed"
    )
    assert row["Total"] == total
    # the new run continued the old one's steps from a checkpoint the old one committed
    log = loop.standin.driver_log(loop.namespace, f"{name}-1")
    resumed = RESUMED.search(log)
    assert resumed is not None and 2 <= int(resumed.group(1)) < total, loop.diagnosis(name)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, total + 1))
    # every pod and driver of the old RayJob had ended before the first of the new one started
    old, new = (loop.standin.lifetimes(loop.namespace, f"{name}-{index}") for index in (0, 1))
    assert {t.kind for t in old} == {t.kind for t in new} == {"pod", "driver"}
    timeline = "\n".join(
        f"{t.kind} {t.name}: {t.started:.2f} .. {'running' if t.stopped is None else f'{t.stopped:.2f}'}"
        for t in [*old, *new]
    )
    assert max(t.stopped or float("inf") for t in old) < min(t.started for t in new), timeline


def test_a_worker_pod_stopped_after_its_head_is_gone_ends_at_once_not_after_the_stop_window(loop: Loop):
    """A RayCluster's deletion (a suspend, a spec change, the RLJob deleted) stops every pod at once, and a head that
    ends first takes the GCS with it: Ray's `ray start` then spends the whole stop window (120 s here) asking the
    GCS to drain the node, with no answer to come (measured with two plain `ray start` nodes: 60.6 s for a 60 s
    window). Worker pods run it under runtime/podinit.py, which ends them once the GCS has stopped answering."""
    name = loop.create(
        short(
            "tiny-grpo-cluster.yaml",
            "tiny-grpo-headless",
            **{"spec.training.totalSteps": ENDLESS, "spec.runPolicy.maxRestarts": 0, **ONE_ACTOR_POD},
        )
    )
    pods = wait_until(
        lambda: (
            len(pods := loop.standin.pods(loop.namespace, f"{name}-0")) == 2
            and all(pod.ready() for pod in pods)
            and pods
        ),
        timeout=300,
        what="the head and the actor pod up",
    )
    (head,) = [pod for pod in pods if pod.group == "head"]
    (worker,) = [pod for pod in pods if pod.group == "actor"]
    (rayjob,) = loop.rayjobs(name).values()
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (ray_container, *_) = group["template"]["spec"]["containers"]
    window = int(next(e["value"] for e in ray_container["env"] if e["name"] == contract.RAY_DRAIN_WINDOW_ENV))
    stopped_within = pods_stop_within(loop, name)

    loop.standin.kill_pod(head)  # its node is gone, the GCS with it
    loop.standin.stop_pod(worker)  # then the kubelet stops the worker pod
    asked = time.monotonic()
    wait_until(lambda: not worker.running(), timeout=window, what="the worker pod ended")
    took = time.monotonic() - asked
    # podinit gives up on the GCS after GCS_GONE_CHECKS failed checks, a second apart; the rest is a busy machine
    assert took < window / 4, f"the worker pod took {took:.0f} s of its {window} s stop window"
    assert "ending the node's processes now" in worker.log.read_text(errors="replace")

    loop.cp.request("DELETE", names.rljob_path(loop.namespace, name))
    wait_until(lambda: not loop.rayjobs(name), timeout=stopped_within, what="the RayJob gone")
