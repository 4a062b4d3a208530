"""A spec change to a running job on a "cluster" (tests/integration/kuberay_standin.py plays KubeRay and the pods):
the operator stops the running RayJob and starts the next one, which continues from the last checkpoint; it creates
the next one only once every pod of the old one is gone, so two runtimes never write to the job's folder at once.

The stand-in records when each pod and each driver ran (`KubeRayStandIn.lifetimes`), each bound erring outwards,
so "the old one's last process ended before the new one's first started" is read from what happened, not inferred.
"""

import json
import re

import pytest

from kuberl.operator import names
from tests.integration.envtest import wait_until
from tests.integration.loop.conftest import QUICK, STEPS, Loop, committed_steps, short

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_longer_run_asked_mid_run_continues_from_the_checkpoint_without_two_runtimes_at_once(loop: Loop):
    name = loop.create(short("tiny-grpo-cluster.yaml", "tiny-grpo-changed", **QUICK))
    folder = loop.job_folder(name)
    wait_until(lambda: committed_steps(folder), timeout=300, interval=0.1, what="the first checkpoint")

    # spec.training.totalSteps is a change a checkpoint can follow (operator/specdiff.py): a restart, not a refusal
    longer = {"spec": {"training": {"totalSteps": STEPS + 2}}}
    path = names.rljob_path(loop.namespace, name)
    loop.cp.request("PATCH", path, longer, content_type="application/merge-patch+json")
    status = loop.wait_phase(name, "Succeeded", timeout=420)

    assert status["restarts"] == 0, loop.diagnosis(name)  # the user's change is no failure
    assert loop.rayjobs(name).keys() == {f"{name}-1"}, loop.diagnosis(name)
    row = wait_until(
        lambda: (row := loop.printed_row(name))["Step"] == STEPS + 2 and row, timeout=30, what="the last step printed"
    )
    assert row["Total"] == STEPS + 2
    # the new run continued the old one's steps from a checkpoint the old one committed
    resumed = re.search(
        r"resumed from the checkpoint of step (\d+)", loop.standin.driver_log(loop.namespace, f"{name}-1")
    )
    assert resumed is not None and int(resumed.group(1)) >= 2, loop.diagnosis(name)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, STEPS + 3))
    # every pod and driver of the old RayJob had ended before the first of the new one started
    old, new = (loop.standin.lifetimes(loop.namespace, f"{name}-{index}") for index in (0, 1))
    assert {t.kind for t in old} == {t.kind for t in new} == {"pod", "driver"}
    last_old = max(t.stopped or float("inf") for t in old)
    first_new = min(t.started for t in new)
    assert last_old < first_new, "\n".join([f"{t.kind} {t.name}: {t.started:.2f} .. {t.stopped}" for t in [*old, *new]])
