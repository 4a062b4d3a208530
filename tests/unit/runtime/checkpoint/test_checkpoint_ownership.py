"""Jobs sharing a checkpoint claim (ReadWriteMany) each keep to their own folder, and refuse another's.

Two RLJobs on one claim used to share its root: each resumed from, and rotated out, the other's
checkpoints (issue #12, item 5). Real CheckpointStores on disk; the trainer group is the stand-in of
test_step_recorder (it writes what a rank's DCP save leaves).
"""

from pathlib import Path
from types import SimpleNamespace

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
    save_one_step(mine)
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert mine.start_point(restart=True) is not None  # the same job resumes from its own
    theirs = Checkpointing(job("grpo-b", checkpoint=shared), tmp_path)
    with pytest.raises(CheckpointLocationError) as refused:
        theirs.start_point(restart=True)  # not even a restart takes over another job's checkpoints
    assert str(refused.value) == (
        f"{tmp_path / 'ckpt'} holds the checkpoints of RLJob team-a/grpo-a (up to step 1), not of this job "
        "(team-a/grpo-b); give this job a location of its own (spec.checkpoint.uri, or --output)"
    )
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before
