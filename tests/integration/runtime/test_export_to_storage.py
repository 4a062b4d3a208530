"""The final model is exported through the checkpoint storage, so it outlives the pods.

`kuberl run` of the demo, in a process of its own (its Ray workers get the AWS_* variables as a pod
gets them from checkpoint.secretRef), checkpointing to S3 (moto's server, moto_s3.py): the exported
model lands at `<checkpoint uri>/model`, not on rank 0's disk, the run says where, and another job
can name it as a model location.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.runtime.checkpoint import export_hf
from kuberl.runtime.models.resolve import resolve_model_path
from tests.integration.runtime.jobs import DEMO
from tests.integration.runtime.moto_s3 import moto_s3

pytestmark = pytest.mark.integration

BUCKET = "kuberl-exports"
CHECKPOINTS = f"s3://{BUCKET}/jobs/tiny-grpo"


def test_a_job_checkpointing_to_s3_exports_its_model_there(tmp_path: Path) -> None:
    manifest = yaml.safe_load(DEMO.read_text())
    spec = manifest["spec"]
    spec["data"]["train"] = str(DEMO.parent / spec["data"]["train"])
    spec["models"]["actor"]["path"] = "tiny://demo"
    spec["training"]["totalSteps"] = 2
    spec["checkpoint"] = {"uri": CHECKPOINTS, "intervalSteps": 2, "exportHf": True}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(manifest))
    ray_tmp = Path(tempfile.mkdtemp(prefix="kr-"))  # Ray's socket paths must stay under 108 bytes
    with moto_s3(BUCKET):
        try:
            finished = subprocess.run(
                [sys.executable, "-m", "kuberl", "run", str(job), "--output", str(tmp_path / "out")],
                capture_output=True,
                text=True,
                env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
                timeout=600,
            )
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
        assert finished.returncode == 0, finished.stderr[-3000:]
        assert f"model: {CHECKPOINTS}/model" in finished.stdout
        assert not (tmp_path / "out" / "model").exists()  # nothing on the disk of a pod that goes away

        # another job can name it as its model: read back through resolve_model_path, as a worker would
        exported = resolve_model_path(f"{CHECKPOINTS}/model", tmp_path / "reader-cache", "spec.models.actor.path")
        base = resolve_model_path("tiny://demo", tmp_path / "reader-cache", "spec.models.actor.path")
        final = export_hf(f"{CHECKPOINTS}/step-000002", str(base), str(tmp_path / "final"))
    weights = dict(AutoModelForCausalLM.from_pretrained(exported).named_parameters())
    for name, expected in AutoModelForCausalLM.from_pretrained(final).named_parameters():
        torch.testing.assert_close(weights[name], expected, rtol=0, atol=0)  # the final step's weights
    assert AutoTokenizer.from_pretrained(exported)("count: 3 4 5")["input_ids"]
