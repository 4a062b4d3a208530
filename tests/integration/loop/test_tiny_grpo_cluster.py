"""examples/tiny-grpo-cluster.yaml on a "cluster": the RLJob created on the API server, the chart's operator, KubeRay
and the pods played by the stand-in (each pod a Ray node with a filesystem of its own), the model on the claim.

The example runs as written but for its length (STEPS steps, a checkpoint every 2) and its model: tiny://demo,
which each pod builds in a second, where tiny://counter pretrains for 20-60 s in every pod of every run (the
suite's time; test_models_on_each_node.py builds a model per node). Its data path, /opt/kuberl/examples/data,
is where the runtime image carries the prompts (the stand-in's "image").
"""

import json
import re
from typing import Any

import pytest
import torch

from tests.integration.envtest import wait_until
from tests.integration.loop.conftest import QUICK, STEPS, Loop, committed_steps, short, weights

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def uninterrupted(loop: Loop) -> tuple[str, dict[str, Any]]:
    """The example, run to the end without interruption: (its name, its final status)."""
    name = loop.create(short("tiny-grpo-cluster.yaml", "tiny-grpo", **QUICK))
    return name, loop.wait_phase(name, "Succeeded", timeout=420)


def test_the_cluster_example_succeeds_shows_its_progress_and_leaves_its_model_on_the_claim(
    loop: Loop, uninterrupted: tuple[str, dict[str, Any]]
):
    name, status = uninterrupted
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
    loop: Loop, uninterrupted: tuple[str, dict[str, Any]]
):
    baseline, _ = uninterrupted
    name = loop.create(short("tiny-grpo-cluster.yaml", "tiny-grpo-killed", **QUICK))
    folder = loop.job_folder(name)
    wait_until(lambda: committed_steps(folder), timeout=300, interval=0.1, what="the first checkpoint")
    (victim, *_) = [pod for pod in loop.standin.pods(loop.namespace, f"{name}-0") if pod.group == "actor"]
    loop.standin.kill_pod(victim)  # the node is gone: no signal, no save

    status = loop.wait_phase(name, "Succeeded", timeout=420)

    assert status["restarts"] == 1
    assert loop.rayjobs(name).keys() == {f"{name}-1"}
    resumed = re.search(
        r"resumed from the checkpoint of step (\d+)", loop.standin.driver_log(loop.namespace, f"{name}-1")
    )
    assert resumed is not None and int(resumed.group(1)) >= 2, loop.diagnosis(name)
    expected = weights(loop.job_folder(baseline) / "model")
    for key, tensor in weights(folder / "model").items():
        torch.testing.assert_close(
            tensor, expected[key], rtol=0, atol=0, msg=f"{key} differs from the uninterrupted run"
        )
