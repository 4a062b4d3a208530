"""Where the final model goes: where every pod and the user can reach it after the job (an object store, the
job's folder on its claim), else in the output folder."""

from pathlib import Path

import pytest

from kuberl.api import parse_rljob
from kuberl.runtime.checkpoint.locations import export_location


def job_checkpointing_to(checkpoint: dict) -> object:
    return parse_rljob(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "grpo", "namespace": "team"},
            "spec": {
                "models": {"actor": {"path": "tiny://demo"}},
                "data": {"train": "prompts.jsonl"},
                "reward": {"function": "tiny_task"},
                "checkpoint": checkpoint,
            },
        }
    )


@pytest.mark.parametrize(
    ("checkpoint", "model"),
    [
        ({}, "/runs/grpo/model"),  # a local run: the output folder, as before
        ({"uri": "/mnt/ckpt/grpo"}, "/runs/grpo/model"),  # a local folder without a claim: still the output
        ({"uri": "s3://bucket/jobs/grpo"}, "s3://bucket/jobs/grpo/model"),  # outlives the pods: beside it
        ({"uri": "s3://bucket/jobs/grpo/"}, "s3://bucket/jobs/grpo/model"),
        ({"pvcClaimName": "shared"}, "/checkpoints/team/grpo/model"),  # the job's folder on the claim
        ({"pvcClaimName": "shared", "uri": "/checkpoints/grpo"}, "/checkpoints/team/grpo/model"),
    ],
)
def test_the_model_is_exported_where_it_outlives_the_pods(checkpoint: dict, model: str) -> None:
    assert export_location(job_checkpointing_to(checkpoint), Path("/runs/grpo")) == model


def test_a_relative_output_folder_is_made_absolute_for_the_rank_that_writes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert export_location(job_checkpointing_to({}), Path("runs/grpo")) == str(tmp_path / "runs" / "grpo" / "model")
