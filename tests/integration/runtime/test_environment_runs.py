"""Jobs with an environment end to end: `run_job` and `kuberl run` on local Ray, the demo model, CPU.

The environment (tests/integration/runtime/environments.py:FlakyReplies) answers every message and breaks
on a fixed share of the prompts, so each step has multi-turn episodes and failed samples, and it scores an
episode by the words of the model's last message, so the episodes of a group score differently and the model
learns from every step.
"""

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.api.contract import ExitCode
from kuberl.runtime.driver import run_job
from tests.conftest import REPO
from tests.integration.runtime.jobs import demo_base_dir, demo_job
from tests.integration.runtime.test_resume import losses, model_bytes, steps_done, wait_for_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 6
PROMPTS, GROUP = 4, 8  # a step's episodes: 4 prompts x the demo's groupSize


def environment_job():
    return demo_job(
        **{
            "training.totalSteps": STEPS,
            "data.batchSize": PROMPTS,
            "rollout.maxNewTokens": 6,
            "environment": {
                "name": "tests.integration.runtime.environments:FlakyReplies",
                "maxTurns": 3,
                "maxEpisodeTokens": 48,
            },
            "checkpoint": {"intervalSteps": 2, "keepLast": 2},
            "models.actor.optim.schedule": "cosine",
        }
    )


def start(job: Path, output: Path, address: str) -> subprocess.Popen:
    """`python -m kuberl.runtime` from the repository's folder, so it and its workers import the test environment."""
    return subprocess.Popen(
        [sys.executable, "-m", "kuberl.runtime", "--spec", str(job), "--output", str(output), "--address", address],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tmp_path_factory):
    output = tmp_path_factory.mktemp("environment-run")
    run = run_job(environment_job(), output, demo_base_dir(), progress=False)
    return output, run


def test_an_environment_job_trains_on_episodes_and_counts_broken_environments_as_failed_samples(uninterrupted):
    _, run = uninterrupted
    assert len(run.history) == STEPS
    for record in run.history:
        assert record["env/episodes"] == PROMPTS * GROUP and 1 < record["env/turns_mean"] <= 3
        assert record["env/ended_failed"] == record["reward/failed"]  # failed samples, not zero rewards
        assert record["env/ended_max_turns"] + record["env/ended_failed"] == PROMPTS * GROUP
        assert record["env/observation_tokens"] > 0 and math.isfinite(record["actor/loss"])
        assert record["env/generation_seconds"] > 0 and record["env/environment_seconds"] > 0
        assert any(name.startswith("env/reward_turns_") for name in record)
    assert sum(record["reward/failed"] for record in run.history) > 0
    assert all(record["actor/grad_norm"] > 0 for record in run.history)  # every step moves the model


def test_a_preempted_environment_job_resumes_bit_identically(tmp_path, ray_session, uninterrupted):
    reference, _ = uninterrupted
    manifest = environment_job().to_manifest()
    manifest["spec"]["data"]["train"] = str(demo_base_dir() / manifest["spec"]["data"]["train"])
    job, output = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(manifest))
    address = ray_session.get_runtime_context().gcs_address
    run = start(job, output, address)
    wait_for_steps(run, output, 3)
    run.send_signal(signal.SIGTERM)
    log, _ = run.communicate(timeout=120)
    assert run.returncode == ExitCode.RESUMABLE, log
    stopped_at = steps_done(output)
    assert stopped_at < STEPS
    again = start(job, output, address)
    log, _ = again.communicate(timeout=300)
    assert again.returncode == 0, log
    assert f"resumed from the checkpoint of step {stopped_at}" in log
    assert losses(output) == losses(reference)
    assert model_bytes(output) == model_bytes(reference)
    turns = [json.loads(line)["env/turns_mean"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert turns == [record["env/turns_mean"] for record in map(json.loads, (reference / "metrics.jsonl").open())]
