"""The hybrid engine with the real vLLM CPU engine: after every weight sync in a multi-step GRPO run
the engine reproduces the trainer's log-probabilities (fp32), colocated and with a separate pool."""

import pytest

from kuberl.runtime.main import run_job
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOLERANCE = 1e-4


@pytest.mark.parametrize(
    "layout",
    [
        {"rollout.mode": "colocated"},
        {"rollout.mode": "separate", "resources.rollout": {"replicas": 2, "cpus": 0.25}},
    ],
    ids=["colocated", "separate"],
)
def test_engine_matches_trainer_after_every_sync(ray_session, tmp_path, layout):
    job = demo_job(
        **{
            "rollout.engine": "vllm",
            "rollout.verifySync": True,
            "rollout.verifySyncTolerance": TOLERANCE,
            "training.totalSteps": 4,
            "checkpoint.exportHf": False,
            **layout,
        }
    )
    assert job.spec.resources.actor.world_size == 2
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    assert len(run.history) == 4
    for record in run.history:
        # the probe after the sync (verifySync raises beyond the tolerance; this keeps the number visible)
        assert record["sync/max_logprob_diff"] <= TOLERANCE
        # and every sampled token of the step: the engine's log-prob against the trainer's forward pass
        assert record["rollout/logprob_diff_max"] <= TOLERANCE
