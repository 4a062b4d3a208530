"""examples/tiny-grpo-cluster.yaml on a "cluster": the RLJob created on the API server, the chart's operator, KubeRay
and the pods played by the stand-in (each pod a Ray node with a filesystem of its own), the model on the claim.

The example runs as written but for its length (STEPS steps, a checkpoint every 2) and its model: tiny://demo,
which each pod builds in a second, where tiny://counter pretrains for 20-60 s in every pod of every run (the
suite's time; test_models_on_each_node.py builds a model per node). Its data path, /opt/kuberl/examples/data,
is where the runtime image carries the prompts (the stand-in's "image").

The example runs twice at once, under two names, on the one claim (`side_by_side`): uninterrupted, and with an
actor pod killed after its first checkpoint. The first is the example's own test and the second's baseline, and
the two together are two jobs sharing a claim while they run.
"""

import json
import re
from typing import Any

import pytest
import torch
import yaml

from tests.integration.envtest import wait_until
from tests.integration.loop.conftest import QUICK, STEPS, Loop, committed_steps, short, weights

pytestmark = [pytest.mark.integration, pytest.mark.slow]

UNINTERRUPTED, KILLED = "tiny-grpo", "tiny-grpo-killed"
RESUMED = re.compile(r"resumed from the checkpoint of step (\d+): (\S+)")


@pytest.fixture(scope="module")
def side_by_side(loop: Loop) -> dict[str, dict[str, Any]]:
    """The example run twice at the same time on its claim: UNINTERRUPTED, and KILLED, whose first actor pod is
    killed once it has committed its first checkpoint (the node is gone: no signal, no save). Each one's final
    status, by name."""
    for name in (UNINTERRUPTED, KILLED):
        loop.create(short("tiny-grpo-cluster.yaml", name, **QUICK))
    # generous deadlines: on a busy 2-core machine the stand-in's pods may need a second `ray start` (the raylet
    # timed out during startup) before the first step runs; a healthy run is done well inside them
    wait_until(lambda: committed_steps(loop.job_folder(KILLED)), timeout=600, interval=0.1, what="the first checkpoint")
    (victim, *_) = [pod for pod in loop.standin.pods(loop.namespace, f"{KILLED}-0") if pod.group == "actor"]
    loop.standin.kill_pod(victim)
    return {name: loop.wait_phase(name, "Succeeded", timeout=600) for name in (KILLED, UNINTERRUPTED)}


def test_the_cluster_example_succeeds_shows_its_progress_and_leaves_its_model_on_the_claim(
    loop: Loop, side_by_side: dict[str, dict[str, Any]]
):
    name, status = UNINTERRUPTED, side_by_side[UNINTERRUPTED]
    records = [json.loads(line) for line in (loop.job_folder(name) / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    row = wait_until(
        lambda: (row := loop.printed_row(name))["Step"] == STEPS and row, timeout=30, what="the last step printed"
    )
    assert (row["Phase"], row["Total"], row["Restarts"]) == ("Succeeded", STEPS, 0)
    assert row["Reward"] == pytest.approx(records[-1]["reward/mean"])
    # the model is on the claim, where the report says, and it loads
    assert status["exportedModel"] == f"/checkpoints/{loop.namespace}/{name}/model"
    assert weights(loop.job_folder(name) / "model")
    # shutdownAfterJobFinishes: the pods go once the job is done
    wait_until(lambda: not loop.standin.processes(loop.namespace), timeout=60, what="the job's pods gone")


def test_a_killed_worker_pod_restarts_the_job_from_its_checkpoint_to_the_same_weights(
    loop: Loop, side_by_side: dict[str, dict[str, Any]]
):
    name, status = KILLED, side_by_side[KILLED]

    assert status["restarts"] == 1
    assert loop.rayjobs(name).keys() == {f"{name}-1"}
    resumed = RESUMED.search(loop.standin.driver_log(loop.namespace, f"{name}-1"))
    assert resumed is not None and int(resumed.group(1)) >= 2, loop.diagnosis(name)
    expected = weights(loop.job_folder(UNINTERRUPTED) / "model")
    for key, tensor in weights(loop.job_folder(name) / "model").items():
        torch.testing.assert_close(
            tensor, expected[key], rtol=0, atol=0, msg=f"{key} differs from the uninterrupted run"
        )


def test_two_jobs_on_one_claim_never_see_each_others_checkpoints(loop: Loop, side_by_side: dict[str, dict[str, Any]]):
    # the two ran at the same time: their first drivers overlapped
    (first, *_), (second, *_) = (
        [t for t in loop.standin.lifetimes(loop.namespace, f"{name}-0") if t.kind == "driver"]
        for name in (UNINTERRUPTED, KILLED)
    )
    assert first.overlaps(second)
    for name, status in side_by_side.items():
        folder, seen_as = loop.job_folder(name), f"/checkpoints/{loop.namespace}/{name}"
        # each job's folder holds only checkpoints its own runs committed (job.yaml: the RLJob each was saved by)
        steps = committed_steps(folder)
        assert steps and steps[-1] == STEPS
        for step in steps:
            saved_by = yaml.safe_load((folder / "checkpoints" / f"step-{step:06d}" / "job.yaml").read_text())
            assert (saved_by["metadata"]["namespace"], saved_by["metadata"]["name"]) == (loop.namespace, name)
        # each one's steps are its own, once each, and so is the checkpoint its status names
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert [record["step"] for record in records] == list(range(1, STEPS + 1))
        assert status["lastCheckpoint"]["uri"].startswith(f"{seen_as}/checkpoints/step-")
    # the restarted job resumed from its own folder's checkpoint, not from the other job's later ones
    resumed = RESUMED.search(loop.standin.driver_log(loop.namespace, f"{KILLED}-1"))
    assert resumed is not None, loop.diagnosis(KILLED)
    assert resumed.group(2) == f"/checkpoints/{loop.namespace}/{KILLED}/checkpoints/step-{int(resumed.group(1)):06d}"
