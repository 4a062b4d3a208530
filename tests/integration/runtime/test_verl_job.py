"""A verl user's GRPO job on kuberl: their launch command, converted by `kuberl convert verl`, runs on
verl-layout parquet files with verl's gsm8k scorer, dropped over-long prompts, two training and two validation
files, padding-free forwards, the actor's parameters and optimiser offloaded to host memory (FSDP2 over the two
ranks), token-budget micro-batches, and wandb (offline) and MLflow (SQLite) receiving metrics.jsonl's records.

The only edits to the converted manifest are what running it on this machine needs (CPU pods, the hf engine,
offline wandb, a local MLflow store) and tags, which verl's command line has no key for.

The task is gsm8k-shaped and easy (tests/integration/runtime/gsm8k_style.py): the tiny model is first taught the
`#### N` answer format with the right N only some of the time, and GRPO must teach it the right numbers.
"""

import json
import math
from pathlib import Path

import pytest

from kuberl.api import parse_rljob
from kuberl.runtime.driver import run_job
from kuberl.runtime.models.resolve import default_cache_dir
from kuberl.runtime.report.tracking import mlflow_name, tracked_metrics
from kuberl.verl.command import read_launch
from kuberl.verl.convert import convert
from tests.integration.runtime.gsm8k_style import STARTS, format_model, write_split
from tests.integration.runtime.tracker_files import mlflow_run_metrics, wandb_offline_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 20


#: In the style of verl's examples/grpo_trainer/run_qwen2-7b.sh, sized for a tiny model on two CPU ranks.
VERL_COMMAND = f"""
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files="['train-a.parquet', 'train-b.parquet']" \\
    data.val_files="['test-a.parquet', 'test-b.parquet']" \\
    data.train_batch_size=8 \\
    data.max_prompt_length=40 \\
    data.max_response_length=6 \\
    data.filter_overlong_prompts=True \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.model.enable_gradient_checkpointing=False \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.fsdp_config.param_offload=True \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \\
    actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64 \\
    actor_rollout_ref.actor.optim.lr=5e-4 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.rollout.n=8 \\
    trainer.logger=['console','wandb','mlflow'] \\
    trainer.project_name=kuberl-tests \\
    trainer.experiment_name=gsm8k-style-grpo \\
    trainer.nnodes=2 \\
    trainer.n_gpus_per_node=1 \\
    trainer.total_training_steps={STEPS} \\
    trainer.test_freq=10 \\
    trainer.save_freq=-1 $@
"""


def verl_job(tmp_path: Path, model: Path) -> dict:
    """The converted command line, with this machine's edits."""
    conversion = convert(read_launch(VERL_COMMAND, {"MODEL": str(model)}))
    assert conversion.changes_training == [], [str(knob) for knob in conversion.lost]
    manifest = conversion.manifest
    spec = manifest["spec"]
    assert spec["algorithm"]["lossAggregation"] == "token_mean"  # verl's, pinned over kuberl's grpo preset
    assert spec["models"]["actor"]["optim"]["weightDecay"] == 0.01  # verl's, pinned over kuberl's 0
    assert spec["training"]["paddingFree"] is True
    assert spec["models"]["actor"]["offload"] == {"params": True, "optimizer": True}
    # the update and the old-log-prob forward (verl's default follows the actor's switch) cut by tokens
    assert spec["models"]["actor"]["maxTokensPerMicroBatch"] == spec["models"]["actor"]["forwardMaxTokensPerMicroBatch"]
    spec["rollout"]["engine"] = "hf"
    spec["resources"]["actor"] |= {"gpus": 0, "cpus": 0.5}
    spec["checkpoint"]["exportHf"] = False
    spec["tracking"] |= {"tags": ["verl", "gsm8k"]}
    spec["tracking"]["wandb"] = {"mode": "offline"}
    spec["tracking"]["mlflow"] = {"trackingUri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    return manifest


def test_a_verl_gsm8k_grpo_job_learns_with_every_verl_feature_on(ray_session, tmp_path: Path) -> None:
    model = format_model(default_cache_dir())
    dropped = sum(
        write_split(tmp_path / name, [i % STARTS for i in range(offset, offset + 150)], "train", overlong_every=10)
        for name, offset in (("train-a.parquet", 0), ("train-b.parquet", 5))
    )
    dropped_validation = write_split(tmp_path / "test-a.parquet", list(range(STARTS)), "test", overlong_every=5)
    dropped_validation += write_split(tmp_path / "test-b.parquet", list(range(STARTS)), "test", overlong_every=7)
    job = parse_rljob(verl_job(tmp_path, model))
    output = tmp_path / "run"
    run = run_job(job, output, tmp_path, progress=False)
    # verl validates before training by default (trainer.val_before_train): the untrained model's record is step 0
    before, *history = run.history
    assert before["step"] == 0 and 0.0 <= before["val/mean@8"] <= 1.0
    assert not any(key.startswith(("reward/", "actor/")) for key in before)

    # verl's gsm8k scorer, chosen by each record's data_source, scores 0 or 1; the mean rises well beyond noise:
    # it starts near 0.13 (one answer in ten, a bit better for the format pass), a step's mean over 64 responses
    # has a standard error of ~0.04, so +0.15 between the first and last five steps is over 5 standard errors.
    # (Measured with verl's token-mean loss and weight decay 0.01: first five steps 0.18, last five 0.40, lr 5e-4.)
    rewards = [record["reward/mean"] for record in history]
    assert all(record["reward/failed"] == 0 for record in history)
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.15, rewards

    # 64 responses a step over 2 ranks: 4 passes of 8 rows each without the budget, more with 64 tokens a pass
    assert all(record["actor/micro_batches"] > 4 for record in history), [r["actor/micro_batches"] for r in history]

    # both training files were read, each losing its over-long tenth; the validation files likewise
    assert dropped == 30 and dropped_validation == 4
    assert {record["data/dropped_overlong_prompts"] for record in history} == {30.0}
    assert {record["data/dropped_overlong_validation_prompts"] for record in history} == {4.0}

    # validation over the two validation files every 10 steps, greedy and 8 samples per prompt
    validated = [record["step"] for record in history if "val/greedy_mean" in record]
    assert validated == [10, 20]
    assert all(0.0 <= history[step - 1]["val/mean@8"] <= 1.0 for step in validated)
    # and verl's per-data-source metrics (one source here, every sample scored: its mean is val/mean@8)
    for step in validated:
        record = history[step - 1]
        assert record["val/openai/gsm8k/reward/mean@8"] == pytest.approx(record["val/mean@8"])
        assert record["val/openai/gsm8k/reward/mean@8"] <= record["val/openai/gsm8k/reward/best@8"] <= 1.0

    # the trackers hold exactly what metrics.jsonl holds, step by step
    lines = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    expected = {line["step"]: tracked_metrics(line) for line in lines}
    assert sorted(expected) == list(range(0, STEPS + 1))

    wandb_run, wandb_history = wandb_offline_run(output)
    assert (wandb_run["project"], wandb_run["name"], wandb_run["tags"]) == (
        "kuberl-tests",
        "gsm8k-style-grpo",
        ["verl", "gsm8k"],
    )
    logged = {row.pop("_step"): row for row in wandb_history}
    assert logged.keys() == expected.keys()
    for step, metrics in expected.items():
        assert logged[step].keys() == metrics.keys()
        assert all(math.isclose(logged[step][key], value, rel_tol=1e-12) for key, value in metrics.items())

    mlflow_run, by_step = mlflow_run_metrics(f"sqlite:///{tmp_path / 'mlflow.db'}", "kuberl-tests")
    assert mlflow_run["name"] == "gsm8k-style-grpo" and mlflow_run["status"] == "FINISHED"
    assert {"verl", "gsm8k"} <= set(mlflow_run["tags"])
    assert by_step == {
        step: {mlflow_name(key): value for key, value in metrics.items()} for step, metrics in expected.items()
    }
