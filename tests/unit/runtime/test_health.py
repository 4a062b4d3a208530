"""runtime/health.py: when a run of NaN steps or of failing rewards ends the job, as table tests; and the
trainer's optimiser step that skips a non-finite update (engines/fsdp.py) on a real tiny model."""

import json
import math

import pytest
import torch

from kuberl.api import parse_rljob
from kuberl.api.spec import OptimizerSpec, RewardSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.health import (
    NonFiniteSteps,
    NonFiniteUpdatesError,
    RewardFailureError,
    RewardFailures,
    RunHealth,
    reward_name,
)

FINE = {"actor/update_skipped": 0.0}
SKIPPED = {"actor/update_skipped": 1.0}


def test_non_finite_steps_in_a_row_fail_the_job_at_the_limit_naming_the_field_and_steps():
    guard = NonFiniteSteps(limit=3)
    verdicts = [guard.observe(step, metrics) for step, metrics in enumerate([FINE, SKIPPED, SKIPPED, SKIPPED], 1)]
    assert verdicts[:3] == [None, None, None]
    assert isinstance(verdicts[3], NonFiniteUpdatesError)
    message = str(verdicts[3])
    assert "steps 2 to 4" in message and "spec.training.maxNonFiniteSteps: 3" in message
    assert "no checkpoint was saved after step 1" in message


def test_a_finite_step_ends_the_run_of_non_finite_ones():
    guard = NonFiniteSteps(limit=2)
    for step, metrics in enumerate([SKIPPED, FINE, SKIPPED, FINE, SKIPPED], 1):
        assert guard.observe(step, metrics) is None


@pytest.mark.parametrize(
    "metrics",
    [{"critic/update_skipped": 1.0}, {"actor/update_skipped": 0.5}, {"actor/update_skipped": math.nan}],
)
def test_any_skipped_update_of_actor_or_critic_counts(metrics):
    assert isinstance(NonFiniteSteps(limit=1).observe(1, metrics), NonFiniteUpdatesError)


def test_no_checkpoint_while_non_finite_steps_are_in_a_row(minimal_manifest):
    job = parse_rljob(minimal_manifest)
    health = RunHealth.from_spec(job.spec)
    assert health.non_finite.limit == 3  # the default of training.maxNonFiniteSteps
    assert health.observe(1, FINE) is None and health.may_checkpoint
    assert health.observe(2, SKIPPED) is None and not health.may_checkpoint
    assert health.observe(3, FINE) is None and health.may_checkpoint


def failures(max_fraction: float, window: int = 3) -> RewardFailures:
    return RewardFailures(max_fraction, window, samples_per_step=10, name="function my.rewards:judge")


def test_reward_failures_above_the_fraction_over_the_window_fail_the_job_naming_the_reward():
    guard = failures(0.5)
    # 6 + 4 + 7 = 17 of 30 samples failed (57%) in steps 3..5; steps 1..3 had 2 + 6 + 4 = 12 (40%)
    verdicts = [
        guard.observe(step, {"reward/failed": n}, "PermissionError: no") for step, n in enumerate([2, 6, 4, 7], 2)
    ]
    assert verdicts[:3] == [None, None, None]
    error = verdicts[3]
    assert isinstance(error, RewardFailureError)
    assert str(error) == (
        "reward function my.rewards:judge failed on 17 of 30 samples (57%) in steps 3 to 5, more than "
        "spec.reward.maxFailureFraction (0.5); the last failure: PermissionError: no"
    )


def test_reward_failures_count_every_sample_a_step_scored_with_dynamic_sampling():
    guard = failures(0.5, window=1)
    # 8 failed: of the 10 a step scores without extra rounds 80%, of the 20 it scored in two rounds 40%
    assert guard.observe(1, {"reward/failed": 8, "reward/samples": 20}, None) is None
    assert isinstance(guard.observe(2, {"reward/failed": 8}, None), RewardFailureError)


def test_reward_failures_are_judged_only_once_the_window_is_full():
    guard = failures(0.0, window=3)
    assert guard.observe(1, {"reward/failed": 10}, None) is None
    assert guard.observe(2, {"reward/failed": 10}, None) is None
    assert isinstance(guard.observe(3, {"reward/failed": 10}, None), RewardFailureError)


def test_a_run_shorter_than_the_window_is_judged_at_its_last_step_over_the_steps_it_had():
    guard = failures(0.5, window=5)
    assert guard.observe(1, {"reward/failed": 10}, None) is None
    error = guard.observe(2, {"reward/failed": 10}, "TimeoutError: the endpoint did not answer", final=True)
    assert isinstance(error, RewardFailureError)
    assert str(error) == (
        "reward function my.rewards:judge failed on 20 of 20 samples (100%) in steps 1 to 2, more than "
        "spec.reward.maxFailureFraction (0.5); the last failure: TimeoutError: the endpoint did not answer"
    )


def test_a_resumed_run_judges_the_same_window_as_one_that_never_stopped(minimal_manifest):
    job = parse_rljob(minimal_manifest)  # failureWindowSteps 5, maxFailureFraction 0.5

    def step(n_failed: int) -> dict[str, float]:
        return {"reward/failed": n_failed, "reward/samples": 32}

    failed = [0, 0, 0, 0, 32, 32]  # steps 5 and 6 fail entirely: 64 of 160 over steps 2..6, 40%
    straight = RunHealth.from_spec(job.spec)
    verdicts = [straight.observe(n, step(f), final=n == 6) for n, f in enumerate(failed, 1)]
    assert verdicts == [None] * 6
    before = RunHealth.from_spec(job.spec)
    for n, f in enumerate(failed[:4], 1):
        before.observe(n, step(f))
    saved = json.loads(json.dumps(before.state()))  # as the checkpoint of step 4 keeps it (train_state.json)
    resumed = RunHealth.from_spec(job.spec)
    resumed.restore(saved)
    assert resumed.observe(5, step(32)) is None
    assert resumed.observe(6, step(32), final=True) is None  # over steps 2..6, as above
    fresh = RunHealth.from_spec(job.spec)  # what it judged without the window: steps 5..6 alone, 100%
    fresh.observe(5, step(32))
    assert isinstance(fresh.observe(6, step(32), final=True), RewardFailureError)


def test_a_step_that_fails_the_job_is_never_checkpointed(minimal_manifest, tmp_path):
    from types import SimpleNamespace

    from kuberl.runtime.checkpoint.checkpointing import Checkpointing
    from kuberl.runtime.driver import StepRecorder
    from kuberl.runtime.loop.controller import StepResult
    from kuberl.runtime.report.metrics import RunReporter
    from kuberl.runtime.report.status_publisher import StatusPublisher
    from tests.unit.runtime.test_step_recorder import ShardWritingGroup

    minimal_manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "checkpoints")}
    job = parse_rljob(minimal_manifest)
    checkpointing = Checkpointing(job, tmp_path)
    checkpointing.groups = SimpleNamespace(trainers=[ShardWritingGroup()])
    reporter = RunReporter(tmp_path, 2, show_progress=False)
    recorder = StepRecorder(
        SimpleNamespace(total_steps=2),
        checkpointing,
        reporter,
        StatusPublisher(),
        SimpleNamespace(requested=False),
        RunHealth.from_spec(job.spec),
        SimpleNamespace(last_failure="PermissionError: no"),
    )
    every_sample_failed = {"reward/failed": 64.0, "reward/samples": 64.0}
    recorder(StepResult(0, 0, every_sample_failed))
    with pytest.raises(RewardFailureError, match="in steps 1 to 2"):
        recorder(StepResult(1, 0, every_sample_failed))  # the last step, which always saves when it passes
    reporter.close()
    assert checkpointing.latest is None and not list((tmp_path / "checkpoints").glob("step-*"))


def test_a_failed_share_equal_to_the_fraction_passes_and_a_fraction_of_1_never_fails():
    at_limit = failures(0.5, window=1)
    assert at_limit.observe(1, {"reward/failed": 5}, None) is None
    never = failures(1.0, window=1)
    assert never.observe(1, {"reward/failed": 10}, None) is None


def test_an_endpoint_reward_is_named_without_its_query():
    spec = RewardSpec.model_validate({"endpoint": {"url": "https://judge.example/score?key=abc"}})
    assert reward_name(spec) == "endpoint https://judge.example/score"


# -- the trainer's optimiser step -----------------------------------------------------------------


@pytest.fixture
def trainer(tmp_path) -> FSDPTrainer:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.models.tiny import build_tiny_model

    build_tiny_model("demo", tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    return FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=0.1), total_steps=10)


def weights(trainer: FSDPTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def backward(trainer: FSDPTrainer, scale: float) -> None:
    loss = sum(p.sum() for p in trainer.model.parameters()) * scale
    loss.backward()


@pytest.mark.parametrize(("scale", "loss"), [(math.nan, 0.5), (math.inf, 0.5), (1.0, math.nan), (1.0, math.inf)])
def test_a_non_finite_update_is_skipped_and_leaves_weights_and_optimiser_untouched(trainer, scale, loss):
    before = weights(trainer)
    backward(trainer, scale)
    step = trainer.optimizer_step(torch.tensor(loss))
    assert step["skipped"] == 1.0
    assert all(torch.equal(before[name], after) for name, after in weights(trainer).items())
    assert trainer.optimizer.state == {}  # no NaN moments either
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.scheduler.last_epoch == 1  # the schedule still follows the steps


def test_a_finite_update_is_taken(trainer):
    before = weights(trainer)
    backward(trainer, 1.0)
    step = trainer.optimizer_step()
    assert step["skipped"] == 0.0 and math.isfinite(float(step["grad_norm"]))
    assert any(not torch.equal(before[name], after) for name, after in weights(trainer).items())


def test_kuberl_run_exits_70_with_the_reason_when_the_job_fails(monkeypatch, capsys, tmp_path):
    from kuberl.api.contract import ExitCode, RuntimeArgs
    from kuberl.runtime import driver, main
    from tests.conftest import REPO

    def fails(*args, **kwargs):  # what run_job raises when health.observe says stop
        raise RewardFailureError("reward function tiny_task failed on 64 of 64 samples")

    monkeypatch.setattr(driver, "run_job", fails)
    args = RuntimeArgs(spec=str(REPO / "examples" / "tiny-grpo.yaml"), output=str(tmp_path))
    assert main.run_from_cli(args) == ExitCode.JOB_FAILED == 70
    assert "the job failed: reward function tiny_task failed on 64 of 64 samples" in capsys.readouterr().err
