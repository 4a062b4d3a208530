"""Checkpoint-resume end to end: a run stopped and restarted is the run that would have happened.

The job runs as `kuberl run` in a subprocess joined to the session's Ray, so a test can send it
SIGTERM (preemption) or SIGKILL (a lost pod) and start it again. On CPU everything is
deterministic, so "the same run" means bit-identical: the same per-step losses in metrics.jsonl
and the same bytes in the exported model.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kuberl.api.contract import ExitCode
from tests.integration.runtime.jobs import DEMO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 6


def write_job(folder: Path) -> Path:
    manifest = yaml.safe_load(DEMO.read_text())
    spec = manifest["spec"]
    spec["data"]["train"] = str(DEMO.parent / spec["data"]["train"])
    spec["training"]["totalSteps"] = STEPS
    spec["models"]["actor"]["optim"]["schedule"] = "cosine"  # the schedule depends on the step: resume must restore it
    spec["checkpoint"] = {"intervalSteps": 2, "keepLast": 2}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def start(job: Path, output: Path, address: str) -> subprocess.Popen:
    kuberl = Path(sys.executable).parent / "kuberl"
    return subprocess.Popen(
        [str(kuberl), "run", str(job), "--output", str(output), "--address", address],
        cwd=output.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def steps_done(output: Path) -> int:
    path = output / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def losses(output: Path) -> list[float]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["actor/loss"] for line in lines]


def model_bytes(output: Path) -> bytes:
    return (output / "model" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def address(ray_session) -> str:
    return ray_session.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, address) -> Path:
    folder = tmp_path_factory.mktemp("uninterrupted")
    output = folder / "out"
    run = start(write_job(folder), output, address)
    log, _ = run.communicate(timeout=300)
    assert run.returncode == 0, log
    assert steps_done(output) == STEPS
    return output


def wait_for_steps(run: subprocess.Popen, output: Path, steps: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while steps_done(output) < steps:
        assert run.poll() is None, run.stdout.read()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def test_sigterm_saves_and_exits_resumable_then_resume_is_bit_identical(tmp_path, address, uninterrupted):
    job, output = write_job(tmp_path), tmp_path / "out"
    run = start(job, output, address)
    wait_for_steps(run, output, 3)
    run.send_signal(signal.SIGTERM)
    # how long the save may take is runPolicy.stopGracePeriodSeconds' business (and no test's clock): a busy
    # machine only makes it slower
    log, _ = run.communicate(timeout=180)
    assert run.returncode == ExitCode.RESUMABLE, log
    stopped_at = steps_done(output)
    assert stopped_at < STEPS and (output / "checkpoints" / f"step-{stopped_at:06d}").is_dir(), log
    assert "run again to resume" in log

    again = start(job, output, address)
    log, _ = again.communicate(timeout=300)
    assert again.returncode == 0, log
    assert f"resumed from the checkpoint of step {stopped_at}" in log
    assert losses(output) == losses(uninterrupted)
    assert model_bytes(output) == model_bytes(uninterrupted)


def test_killed_runs_resume_from_an_intact_checkpoint_and_finish_identically(tmp_path, address, uninterrupted):
    """SIGKILL of the whole process group (a lost pod) at moments that include checkpoint writes."""
    job, output = write_job(tmp_path), tmp_path / "out"
    kills = 0
    for target in (2, 4):  # a checkpoint is being written right after these steps
        run = start(job, output, address)
        wait_for_steps(run, output, target)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        kills += 1
    run = start(job, output, address)
    log, _ = run.communicate(timeout=300)
    assert run.returncode == 0, log
    assert kills == 2 and "resumed from the checkpoint of step" in log
    assert losses(output) == losses(uninterrupted)
    assert model_bytes(output) == model_bytes(uninterrupted)
