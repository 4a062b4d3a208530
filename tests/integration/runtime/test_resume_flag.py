"""`--resume` marks a restart of the same run, with real checkpoints on disk.

With `checkpoint.resume: false` a run starts fresh, and refuses a location that already holds
checkpoints (naming the field, deleting nothing); the same run restarted with `--resume` (as the
operator restarts it) carries on from the latest committed checkpoint.
"""

import json
from pathlib import Path

import pytest
import yaml

from kuberl.api.contract import ExitCode, RuntimeArgs
from kuberl.runtime.main import run_from_cli
from tests.integration.runtime.jobs import DEMO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_job(folder: Path, steps: int) -> Path:
    manifest = yaml.safe_load(DEMO.read_text())
    spec = manifest["spec"]
    spec["data"]["train"] = str(DEMO.parent / spec["data"]["train"])
    spec["training"]["totalSteps"] = steps
    spec["checkpoint"] = {"intervalSteps": 1, "keepLast": 5, "resume": False, "exportHf": False}
    path = folder / f"job-{steps}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def saved(checkpoints: Path) -> dict[str, int]:
    """Every file under the checkpoint root with its modification time."""
    return {str(f.relative_to(checkpoints)): f.stat().st_mtime_ns for f in checkpoints.rglob("*") if f.is_file()}


def steps_logged(output: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()]


def test_resume_false_starts_fresh_refuses_saved_work_and_resume_flag_carries_on(ray_session, tmp_path, capsys):
    output = tmp_path / "out"
    checkpoints = output / "checkpoints"

    # a fresh location: the run starts from step 0 and saves after each step
    assert run_from_cli(RuntimeArgs(spec=str(write_job(tmp_path, 2)), output=str(output))) == ExitCode.SUCCESS
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-000001", "step-000002"]
    before = saved(checkpoints)

    # the same location again without --resume: refused before any worker starts, nothing touched
    longer = write_job(tmp_path, 3)
    capsys.readouterr()
    assert run_from_cli(RuntimeArgs(spec=str(longer), output=str(output))) == ExitCode.CONFIG_ERROR
    refusal = capsys.readouterr().err
    assert "spec.checkpoint.resume is false" in refusal and "up to step 2" in refusal and "--resume" in refusal
    assert saved(checkpoints) == before

    # a restart of the same run: --resume carries on from step 2 whatever checkpoint.resume says
    assert run_from_cli(RuntimeArgs(spec=str(longer), output=str(output), resume=True)) == ExitCode.SUCCESS
    assert steps_logged(output) == [1, 2, 3]
    assert (checkpoints / "step-000003").is_dir()
    kept = {name: mtime for name, mtime in before.items() if name.startswith("step-")}
    assert {name: mtime for name, mtime in saved(checkpoints).items() if name in kept} == kept  # read, not rewritten
