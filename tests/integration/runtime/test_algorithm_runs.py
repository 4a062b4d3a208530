"""DAPO in full on the embedded default: dynamic sampling, the overlong penalty, failing rewards, the rollout
correction, validation (before training too).

The per-preset learning check (each preset 20 steps, reward rises) is bench/presets.py; this run
checks the wiring of everything a step can now do, on real Ray, FSDP2 over gloo and the tiny model.
"""

import json

import pytest

from kuberl.runtime.driver import run_job
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VALIDATION = demo_base_dir().parent / "tests" / "integration" / "runtime" / "data" / "tiny-validation.jsonl"


def test_dapo_with_failing_rewards_trains_informative_groups_and_validates(ray_session, tmp_path):
    correction = {"importanceSampling": "token", "rejection": "token", "rejectionThresholdHigh": 2.0}
    job = demo_job(
        **{
            "algorithm": {"name": "dapo", "groupSize": 4, "rolloutCorrection": correction},
            "reward.function": "tests.integration.runtime.algorithm_rewards:flaky_tiny_task",
            "data.batchSize": 4,
            "data.validation": str(VALIDATION),
            "training.totalSteps": 4,
            "training.validationEverySteps": 2,
            "training.validateBeforeTraining": True,
        }
    )
    assert job.spec.reward.overlong_penalty.buffer_length == 2  # a fifth of maxNewTokens 12
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    before, history = run.history[0], run.history[1:]
    # validateBeforeTraining: the untrained model scored as the record of step 0, with nothing trained in it
    assert before["step"] == 0 and before["val/samples"] == 4 and "actor/loss" not in before
    assert [record["step"] for record in history] == [1, 2, 3, 4]
    for record in history:
        # dynamic sampling: no more groups train than were found informative, and never more than the batch
        trained = record["dynamic_sampling/groups_trained"]
        assert trained <= record["dynamic_sampling/groups_informative"] and trained <= 4
        assert 1 <= record["dynamic_sampling/rounds"] <= 8
        assert ("actor/loss" in record) == (trained > 0)
        if trained:
            # decoupled correction: the trainer recomputes log pi_old (its own pass), weighs it against the
            # engine's; the hf engine runs the trainer's fp32 weights, so the two agree and nothing is cut
            assert record["time/old_logprobs"] > 0
            assert record["correction/log_weight_abs_mean"] < 1e-3
            assert record["correction/is_truncated_fraction"] == 0 and record["correction/rejected_fraction"] == 0
        # the overlong penalty shows in the reward metrics: most random responses run to the budget
        assert record["reward/overlong_penalty_mean"] <= 0 and 0 <= record["reward/overlong_fraction"] <= 1
        # and what the reward returns beside its score, the mean over the responses it scored (tiny_task's)
        assert 0 <= record["reward/extra/matched_share"] <= 1 and record["reward/extra/extra_words"] >= 0
    assert sum(record["reward/failed"] for record in history) > 0  # the flaky reward did fail, and the run went on
    assert any(record["reward/overlong_fraction"] > 0 for record in history)
    # validation after steps 2 and 4, greedy and 4 samples per prompt; a graded reward: no pass@k / maj@k
    validated = [record["step"] for record in history if "val/greedy_mean" in record]
    assert validated == [2, 4]
    last = history[-1]
    assert last["val/samples"] == 4 and 0 <= last["val/mean@4"] <= 1 and "val/pass@4" not in last
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [("val/mean@4" in line) for line in lines] == [True, False, True, False, True]
    assert any((tmp_path / "tensorboard").iterdir()) and (tmp_path / "training.png").stat().st_size > 10_000
