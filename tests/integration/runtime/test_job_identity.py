"""A job deleted and created again under its name never resumes the earlier run's checkpoints, and no run resumes
a checkpoint its spec cannot follow (issue #36, item 2: another actor model resumed at step 2 and the old
weights were exported as the new model).

Real runs of the demo through `kuberl run`'s entry (run_from_cli), with their checkpoints on disk; the RLJob's
uid comes from the environment, as the operator sets it in the job's pods (contract.JOB_UID_ENV).
"""

from pathlib import Path

import pytest
import yaml

from kuberl.api.contract import JOB_UID_ENV, ExitCode, RuntimeArgs
from kuberl.runtime.main import run_from_cli
from tests.integration.runtime.jobs import DEMO
from tests.integration.runtime.test_resume_flag import saved, steps_logged

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def write_job(folder: Path, steps: int, actor: str = "tiny://counter") -> Path:
    manifest = yaml.safe_load(DEMO.read_text())
    spec = manifest["spec"]
    spec["data"]["train"] = str(DEMO.parent / spec["data"]["train"])
    spec["training"]["totalSteps"] = steps
    spec["models"]["actor"]["path"] = actor
    spec["resources"]["actor"]["replicas"] = 1
    spec["checkpoint"] = {"intervalSteps": 1, "exportHf": False}
    path = folder / f"job-{steps}-{actor.rsplit('/', 1)[-1]}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_an_rljob_created_again_under_its_name_is_refused_the_earlier_ones_checkpoints_until_taken_over(
    ray_session, tmp_path, capsys, monkeypatch
):
    output = tmp_path / "out"
    checkpoints = output / "checkpoints"
    monkeypatch.setenv(JOB_UID_ENV, "uid-1")
    assert run_from_cli(RuntimeArgs(spec=str(write_job(tmp_path, 2)), output=str(output))) == ExitCode.SUCCESS
    before = saved(checkpoints)

    # deleted and created again under its name, with another actor model: refused before any worker starts
    monkeypatch.setenv(JOB_UID_ENV, "uid-2")
    other_actor = write_job(tmp_path, 3, actor="tiny://demo")
    capsys.readouterr()
    assert run_from_cli(RuntimeArgs(spec=str(other_actor), output=str(output))) == ExitCode.CONFIG_ERROR
    refusal = capsys.readouterr().err
    assert "holds the checkpoints of an earlier RLJob tiny-grpo (uid uid-1, up to step 2)" in refusal
    assert f"To carry on from those checkpoints on purpose, remove {checkpoints / 'owner.json'}" in refusal
    assert saved(checkpoints) == before

    # taken over on purpose: its spec still has to be one the checkpoint can follow
    (checkpoints / "owner.json").unlink()
    assert run_from_cli(RuntimeArgs(spec=str(other_actor), output=str(output))) == ExitCode.CONFIG_ERROR
    refusal = capsys.readouterr().err
    assert "spec.models.actor.path changed from 'tiny://counter' to 'tiny://demo'" in refusal
    assert {name: mtime for name, mtime in saved(checkpoints).items() if name.startswith("step-")} == {
        name: mtime for name, mtime in before.items() if name.startswith("step-")
    }

    # the same model carries on from step 2, and the location is the new job's from now on
    assert run_from_cli(RuntimeArgs(spec=str(write_job(tmp_path, 3)), output=str(output))) == ExitCode.SUCCESS
    assert steps_logged(output) == [1, 2, 3]
    assert '"uid": "uid-2"' in (checkpoints / "owner.json").read_text()
