"""Real RL runs on the embedded default: local Ray, FSDP2 over gloo, the tiny demo model on CPU."""

import json

import pytest

from kuberl.runtime.driver import run_job
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def rewards(run) -> list[float]:
    return [record["reward/mean"] for record in run.history]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_tiny_grpo_demo_learns(ray_session, tmp_path, engine):
    # The demo task pays 0.5 for answering in integers and 0.5 for the right ones. A random model
    # writes integers ~20% of the time, so the first steps score ~0.1; the mean over 64 responses
    # moves by ~0.0125 (one standard error) between steps. Learning the integer format alone lifts
    # it to ~0.5 within ~25 steps; demanding +0.15 (12 standard errors) cannot pass by chance.
    job = demo_job(**{"training.totalSteps": 30, "rollout.engine": engine})
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    first, last = rewards(run)[:5], rewards(run)[-5:]
    assert sum(last) / 5 > sum(first) / 5 + 0.15, rewards(run)
    # what a user finds afterwards
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 31))
    assert (tmp_path / "training.png").stat().st_size > 10_000
    assert any((tmp_path / "tensorboard").iterdir())
    assert (run.model_dir / "config.json").exists() and (run.model_dir / "tokenizer.json").exists()
    assert run.history[-1]["reward/pool_size"] == 1  # no reward pool in the spec: one reward worker


def test_ppo_with_a_critic_runs_and_improves(ray_session, tmp_path):
    job = demo_job(
        **{
            "algorithm": {"name": "ppo", "groupSize": 1},
            "models.critic": {"optim": {"lr": 0.003}},
            "data.batchSize": 32,
            "training.totalSteps": 30,
        }
    )
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    history = run.history
    assert all("critic/loss" in record and "actor/loss" in record for record in history)
    # PPO's preset puts the KL in the reward: the old log-probs get a pass of their own before the advantages
    assert all(record["time/old_logprobs"] > 0 and "kl/mean" in record for record in history)
    first, last = rewards(run)[:5], rewards(run)[-5:]
    assert sum(last) / 5 > sum(first) / 5 + 0.1, rewards(run)
