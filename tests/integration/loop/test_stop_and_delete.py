"""Stopping a running job on a "cluster" (tests/integration/kuberay_standin.py plays KubeRay and the pods): deleting
the RLJob removes everything it made, and suspending it keeps the checkpoints the resumed run continues from."""

import re
import urllib.error

import pytest

from kuberl.operator import names
from tests.integration.envtest import wait_until
from tests.integration.kuberay_standin import alive
from tests.integration.loop.conftest import QUICK, Loop, committed_steps, short

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The demo's shape without its pretraining: every pod builds its own copy in a second, not in a minute.


def gone(loop: Loop, path: str) -> bool:
    try:
        loop.cp.request("GET", path)
    except urllib.error.HTTPError as error:
        return error.code == 404
    return False


def test_deleting_the_rljob_mid_run_removes_its_rayjob_configmap_and_processes(loop: Loop):
    name = loop.create(
        short("tiny-grpo-cluster.yaml", "tiny-grpo-deleted", **{"spec.training.totalSteps": 200, **QUICK})
    )
    wait_until(
        lambda: ((loop.rljob(name).get("status") or {}).get("progress") or {}).get("step"),
        timeout=300,
        what="the first step reported",
    )
    processes = loop.standin.processes(loop.namespace, f"{name}-0")
    assert processes

    loop.cp.request("DELETE", names.rljob_path(loop.namespace, name))

    wait_until(lambda: not loop.rayjobs(name), timeout=120, what="the RayJob gone")
    wait_until(
        lambda: gone(loop, names.configmap_path(loop.namespace, names.configmap_name(name))),
        timeout=30,
        what="the spec ConfigMap gone",
    )
    wait_until(lambda: not alive(processes), timeout=30, what="every process of the job's pods gone")


def test_a_suspended_job_resumes_from_its_last_checkpoint(loop: Loop):
    name = loop.create(
        short("tiny-grpo-cluster.yaml", "tiny-grpo-suspended", **{"spec.training.totalSteps": 8, **QUICK})
    )
    folder = loop.job_folder(name)
    wait_until(lambda: committed_steps(folder), timeout=300, interval=0.1, what="the first checkpoint")

    suspend = {"spec": {"runPolicy": {"suspend": True}}}
    path = names.rljob_path(loop.namespace, name)
    loop.cp.request("PATCH", path, suspend, content_type="application/merge-patch+json")
    loop.wait_phase(name, "Suspended", timeout=60)
    wait_until(lambda: not loop.rayjobs(name), timeout=120, what="the RayJob gone")
    assert not loop.standin.processes(loop.namespace)
    last = committed_steps(folder)[-1]

    resume = {"spec": {"runPolicy": {"suspend": False}}}
    loop.cp.request("PATCH", path, resume, content_type="application/merge-patch+json")
    status = loop.wait_phase(name, "Succeeded", timeout=420)

    assert status["restarts"] == 0  # a resume is no restart
    log = loop.standin.driver_log(loop.namespace, f"{name}-1")
    resumed = re.search(r"resumed from the checkpoint of step (\d+)", log)
    assert resumed is not None and int(resumed.group(1)) == last > 0, loop.diagnosis(name)
