"""The hybrid engine with the real vLLM CPU engine: after every weight sync in a multi-step GRPO run
the engine reproduces the trainer's log-probabilities (fp32), colocated and with a separate pool, and
with bf16 training (the probe scores in the weights' fp32).

A colocated engine sleeps before the trainer's passes of every step and wakes in the sync; on the CPU
sleeping frees nothing, but the engine refuses to generate, score or take weights while asleep
(engines/base.py SleepState), so a run that finishes kept the order every step."""

import pytest

from kuberl.runtime.driver import run_job
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOLERANCE = 1e-4


@pytest.mark.parametrize(
    "layout",
    [
        {"rollout.placement": "colocated"},
        {"rollout.placement": "separate", "resources.rollout": {"replicas": 2, "cpus": 0.25}},
        {"rollout.placement": "colocated", "training.computeDtype": "bfloat16"},
    ],
    ids=["colocated", "separate", "colocated-bf16-training"],
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
        # (bf16 training scores in bf16 against the fp32 engine: close, not equal)
        bf16 = job.spec.training.compute_dtype == "bfloat16"
        assert record["rollout/logprob_diff_max"] <= (0.5 if bf16 else TOLERANCE)
        # the colocated engine slept (freeing nothing off the GPU); a separate pool's never does
        colocated = job.spec.rollout.placement == "colocated"
        assert record.get("engine/sleep_freed_bytes") == (0.0 if colocated else None)
