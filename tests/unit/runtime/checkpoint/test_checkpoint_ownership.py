"""Jobs sharing a checkpoint claim (ReadWriteMany) each keep to their own folder, and refuse another's.

Two RLJobs on one claim used to share its root: each resumed from, and rotated out, the other's
checkpoints (issue #12, item 5). A job pointed at another's location deleted that job's save in progress
before refusing it, and a job deleted and created again under its name (the way out of a refused spec
change) resumed the earlier one's checkpoints under its new spec: another actor model (issue #36, items 2
and 4). Real CheckpointStores on disk; the trainer group is the stand-in of test_step_recorder (it writes
what a rank's DCP save leaves).
"""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.api.contract import CHECKPOINT_MOUNT_DIR
from kuberl.runtime.checkpoint.checkpointing import Checkpointing, CheckpointLocationError
from kuberl.runtime.checkpoint.locations import checkpoint_uri, default_output_dir
from tests.conftest import REPO
from tests.unit.runtime.test_step_recorder import ShardWritingGroup


def job(name: str, namespace: str | None = "team-a", checkpoint: dict | None = None):
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    manifest["metadata"] = {"name": name, **({"namespace": namespace} if namespace else {})}
    manifest["spec"]["checkpoint"] = checkpoint or {"pvcClaimName": "shared"}
    return parse_rljob(manifest)


def test_jobs_on_one_claim_write_under_their_own_namespace_and_name():
    first, second, other_team = job("grpo-a"), job("grpo-b"), job("grpo-a", "team-b")
    folders = {checkpoint_uri(j, default_output_dir(j)) for j in (first, second, other_team)}
    assert folders == {
        f"{CHECKPOINT_MOUNT_DIR}/team-a/grpo-a/checkpoints",
        f"{CHECKPOINT_MOUNT_DIR}/team-a/grpo-b/checkpoints",
        f"{CHECKPOINT_MOUNT_DIR}/team-b/grpo-a/checkpoints",
    }
    assert default_output_dir(first) == Path(CHECKPOINT_MOUNT_DIR) / "team-a" / "grpo-a"


def save_one_step(checkpointing: Checkpointing) -> None:
    checkpointing.groups = SimpleNamespace(trainers=[ShardWritingGroup()])
    checkpointing.after_step(0, 0, final=True, preempted=False)


def test_a_location_holding_another_jobs_checkpoints_is_refused_naming_both_and_left_untouched(tmp_path):
    shared = {"uri": str(tmp_path / "ckpt")}
    mine = Checkpointing(job("grpo-a", checkpoint=shared), tmp_path)
    assert mine.start_point(restart=False) is None
    save_one_step(mine)
    assert mine.start_point(restart=True) is not None  # the same job resumes from its own
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    theirs = Checkpointing(job("grpo-b", checkpoint=shared), tmp_path)
    with pytest.raises(CheckpointLocationError) as refused:
        theirs.start_point(restart=True)  # not even a restart takes over another job's checkpoints
    assert str(refused.value) == (
        f"{tmp_path / 'ckpt'} holds the checkpoints of RLJob team-a/grpo-a (up to step 1), not of this job "
        "(team-a/grpo-b); give this job a location of its own (spec.checkpoint.uri, or --output)"
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its content: what a refused job must leave as it was."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def save_in_progress(checkpointing: Checkpointing, step: int) -> Path:
    """A save a rank is still writing: its shards in the store's folder for `step`, no commit yet."""
    location = Path(checkpointing.store.begin(step))
    ShardWritingGroup().call("save_checkpoint", str(location))
    return location


@pytest.mark.parametrize("committed", [True, False], ids=["after-a-commit", "before-its-first-commit"])
def test_a_job_pointed_at_another_jobs_location_touches_nothing_there_not_its_save_in_progress(tmp_path, committed):
    shared = {"uri": str(tmp_path / "ckpt")}
    theirs = Checkpointing(job("grpo-a", checkpoint=shared), tmp_path)
    assert theirs.start_point(restart=False) is None
    if committed:
        save_one_step(theirs)
    in_progress = save_in_progress(theirs, 2)
    before = files_under(tmp_path / "ckpt")
    with pytest.raises(CheckpointLocationError) as refused:
        Checkpointing(job("grpo-b", checkpoint=shared), tmp_path).start_point(restart=True)
    held = "up to step 1" if committed else "none committed yet: a save may be under way"
    assert f"holds the checkpoints of RLJob team-a/grpo-a ({held}), not of this job (team-a/grpo-b)" in str(
        refused.value
    )
    assert in_progress.is_dir() and files_under(tmp_path / "ckpt") == before


def test_the_same_job_opening_its_location_removes_its_own_crashed_save(tmp_path):
    mine = Checkpointing(job("grpo-a", checkpoint={"uri": str(tmp_path / "ckpt")}), tmp_path)
    mine.start_point(restart=False)
    save_one_step(mine)
    crashed = save_in_progress(mine, 2)
    again = Checkpointing(job("grpo-a", checkpoint={"uri": str(tmp_path / "ckpt")}), tmp_path)
    assert again.start_point(restart=True).step == 1
    assert not crashed.exists()


def rljob(uid: str, tmp_path: Path, **spec: Any) -> Checkpointing:
    """The RLJob team-a/grpo-a as the operator runs it: its uid from the pod's environment."""
    manifest = job("grpo-a", checkpoint={"uri": str(tmp_path / "ckpt")}).to_manifest()
    for path, value in spec.items():
        *parents, leaf = path.split(".")
        node = manifest["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return Checkpointing(parse_rljob(manifest), tmp_path, uid=uid)


def test_a_job_created_again_under_the_same_name_is_refused_the_earlier_ones_checkpoints(tmp_path):
    earlier = rljob("uid-1", tmp_path)
    earlier.start_point(restart=False)
    save_one_step(earlier)
    before = files_under(tmp_path / "ckpt")
    again = rljob("uid-2", tmp_path)
    with pytest.raises(CheckpointLocationError) as refused:
        again.start_point(restart=False)
    owner = tmp_path / "ckpt" / "owner.json"
    assert str(refused.value) == (
        f"{tmp_path / 'ckpt'} holds the checkpoints of an earlier RLJob team-a/grpo-a (uid uid-1, up to step 1), "
        "deleted since: this RLJob (uid uid-2) has its name but is another job, and does not resume another job's "
        f"run. To start over, point spec.checkpoint.uri at an empty location, or remove {tmp_path / 'ckpt'}. To "
        f"carry on from those checkpoints on purpose, remove {owner} (the record of the job that wrote them): the "
        "next start takes them over, if this job's spec can resume them"
    )
    assert files_under(tmp_path / "ckpt") == before
    # taken over on purpose: the record removed, the new job resumes and the location is now its own
    owner.unlink()
    assert again.start_point(restart=False).step == 1
    assert json.loads(owner.read_text()) == {"namespace": "team-a", "name": "grpo-a", "uid": "uid-2"}
    with pytest.raises(CheckpointLocationError, match="uid uid-2, up to step 1"):
        rljob("uid-1", tmp_path).start_point(restart=True)


def test_a_restart_of_the_same_rljob_keeps_resuming_with_resume_false_too(tmp_path):
    first = rljob("uid-1", tmp_path, **{"checkpoint.resume": False})
    assert first.start_point(restart=False) is None
    save_one_step(first)
    restarted = rljob("uid-1", tmp_path, **{"checkpoint.resume": False, "training.totalSteps": 90})  # a safe change
    assert restarted.start_point(restart=True).step == 1  # --resume, as the operator restarts it


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"models.actor.path": "tiny://other"},
            "spec.models.actor.path changed from 'tiny://counter' to 'tiny://other'",
        ),
        ({"algorithm.name": "rloo"}, "spec.algorithm.name changed from grpo to rloo"),
        ({"models.actor.dtype": "bfloat16"}, "spec.models.actor.dtype changed from 'float32' to 'bfloat16'"),
    ],
    ids=["actor", "algorithm", "dtype"],
)
def test_a_checkpoint_is_not_resumed_under_a_spec_it_cannot_follow(tmp_path, change, field):
    local = Checkpointing(job("grpo-a", checkpoint={"uri": str(tmp_path / "ckpt")}), tmp_path)  # kuberl run: no uid
    local.start_point(restart=False)
    save_one_step(local)
    before = files_under(tmp_path / "ckpt")
    with pytest.raises(CheckpointLocationError) as refused:
        rljob("uid-1", tmp_path, **change).start_point(restart=True)
    assert f"{tmp_path / 'ckpt'} holds checkpoints up to step 1 that this job's spec cannot resume: {field}" in str(
        refused.value
    )
    assert str(refused.value).endswith(
        f"To start over, point spec.checkpoint.uri at an empty location, or remove {tmp_path / 'ckpt'}"
    )
    assert files_under(tmp_path / "ckpt") == before


def test_checkpoints_an_older_kuberl_wrote_are_this_jobs_by_name_and_held_to_its_spec(tmp_path):
    old = Checkpointing(job("grpo-a", checkpoint={"uri": str(tmp_path / "ckpt")}), tmp_path)
    save_one_step(old)  # an older kuberl: no owner record, the checkpoint's job.yaml names the job
    assert not (tmp_path / "ckpt" / "owner.json").exists()
    with pytest.raises(CheckpointLocationError, match="spec.models.actor.path changed"):
        rljob("uid-7", tmp_path, **{"models.actor.path": "tiny://other"}).start_point(restart=False)
    assert rljob("uid-7", tmp_path).start_point(restart=False).step == 1
    assert json.loads((tmp_path / "ckpt" / "owner.json").read_text())["uid"] == "uid-7"
