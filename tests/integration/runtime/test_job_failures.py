"""Jobs that must fail, and fail loudly: NaN updates, failing rewards, a stuck step. Real runs of the
demo (local Ray, FSDP2 over gloo, the tiny model on CPU), each a few steps long.

The status the runtime publishes goes to a loopback server that records it (the RecordingApiServer
of the publisher's unit tests stands in for the API server, which is not what is tested here).
"""

import json
from pathlib import Path

import pytest

from kuberl.api.status import REPORT_KEY
from kuberl.runtime.deadline import StepTimeoutError
from kuberl.runtime.driver import run_job
from kuberl.runtime.health import NonFiniteUpdatesError, RewardFailureError
from kuberl.runtime.report.status_publisher import KubernetesStatusPublisher, StatusPublisher
from tests.integration.runtime.jobs import DEMO, demo_base_dir, demo_job
from tests.unit.runtime.checkpoint.test_checkpoint_store import RecordingApiServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REWARDS = "tests.integration.runtime.slow_rewards"


def metrics_lines(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch):
    """The report bodies the run publishes (as it would inside an operator-started pod)."""
    server = RecordingApiServer()
    monkeypatch.setattr(
        StatusPublisher,
        "from_environment",
        staticmethod(
            lambda rayjob=None: KubernetesStatusPublisher(
                "demo", "team-a", server.url, None, None, configmap="demo-progress", min_interval=0.0, rayjob=rayjob
            )
        ),
    )
    yield server.requests
    server.close()


def poisoned_data(folder: Path) -> Path:
    """The demo's first 32 prompts, in order, the last 16 marked "poison" (steps 3 and 4 at batch size 8)."""
    lines = (DEMO.parent / "data" / "tiny-task.jsonl").read_text().splitlines()[:32]
    records = [{**json.loads(line), **({"poison": True} if index >= 16 else {})} for index, line in enumerate(lines)]
    path = folder / "poisoned.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_nan_updates_are_skipped_and_fail_the_job_keeping_the_good_checkpoints(ray_session, tmp_path, published):
    job = demo_job(
        **{
            "data.train": str(poisoned_data(tmp_path)),
            "data.shuffle": False,
            "reward.function": f"{REWARDS}:overflow_on_poison",  # 1e39: an infinite float32 score, NaN advantages
            "training.totalSteps": 4,
            "training.maxNonFiniteSteps": 2,
            "checkpoint": {"intervalSteps": 1, "keepLast": 2, "exportHf": False},
        }
    )
    output = tmp_path / "out"
    with pytest.raises(NonFiniteUpdatesError) as failed:
        run_job(job, output, demo_base_dir(), progress=False)
    good = output / "checkpoints" / "step-000002"
    assert str(failed.value) == (
        "steps 3 to 4: the loss or gradient norm was NaN or infinite in 2 steps in a row "
        "(spec.training.maxNonFiniteSteps: 2); their updates were skipped and no checkpoint was saved after step 2; "
        f"the latest checkpoint, kept: {good} (step 2)"
    )
    # keepLast 2 kept steps 1 and 2: nothing was saved after the poisoned steps to rotate them out
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == [
        "latest",
        "owner.json",
        "step-000001",
        "step-000002",
    ]
    lines = metrics_lines(output)
    assert [line["actor/update_skipped"] for line in lines] == [0.0, 0.0, 1.0, 1.0]
    assert [line["actor/grad_norm"] for line in lines[2:]] == ["NaN", "NaN"]  # recorded, not dropped
    assert lines[2]["reward/mean"] == "Infinity"
    last = json.loads(published[-1]["body"]["data"][REPORT_KEY])
    assert last["progress"]["step"] == 4 and last["lastCheckpoint"]["uri"] == str(good)
    assert "rewardMean" not in last["metrics"]  # JSON cannot carry it, the operator would refuse the report


def test_a_reward_failing_above_max_failure_fraction_fails_the_job_naming_it(ray_session, tmp_path):
    job = demo_job(
        **{
            "reward": {"function": f"{REWARDS}:always_raises", "maxFailureFraction": 0.9, "failureWindowSteps": 2},
            "training.totalSteps": 4,
            "resources.actor.replicas": 1,
            "checkpoint": {"exportHf": False},
        }
    )
    with pytest.raises(RewardFailureError) as failed:
        run_job(job, tmp_path, demo_base_dir(), progress=False)
    assert str(failed.value).startswith(
        f"reward function {REWARDS}:always_raises failed on 128 of 128 samples (100%) in steps 1 to 2, more than "
        "spec.reward.maxFailureFraction (0.9); the last failure: PermissionError: the judge refused the API key"
    )
    assert len(metrics_lines(tmp_path)) == 2  # judged once the window was full, and not a step later


def test_a_job_shorter_than_the_failure_window_whose_rewards_all_failed_fails_and_exports_nothing(
    ray_session, tmp_path
):
    job = demo_job(
        **{
            "reward": {"function": f"{REWARDS}:always_raises"},  # failureWindowSteps 5 (the default), 2 steps
            "training.totalSteps": 2,
            "resources.actor.replicas": 1,
        }
    )
    for restart in (False, True):  # the operator's restart (--resume) fails the same way: nothing was saved
        with pytest.raises(RewardFailureError) as failed:
            run_job(job, tmp_path, demo_base_dir(), progress=False, restart=restart)
        assert str(failed.value).startswith(
            f"reward function {REWARDS}:always_raises failed on 128 of 128 samples (100%) in steps 1 to 2, more "
            "than spec.reward.maxFailureFraction (0.5)"
        )
        assert not (tmp_path / "model").exists()
        assert not list((tmp_path / "checkpoints").glob("step-*"))


def test_a_step_past_step_timeout_seconds_fails_the_job_naming_what_it_waited_for(ray_session, tmp_path):
    job = demo_job(
        **{
            "reward": {"function": f"{REWARDS}:sleep_forever", "sampleTimeoutSeconds": 3600},
            "training.totalSteps": 2,
            "training.stepTimeoutSeconds": 10,
            "resources.actor.replicas": 1,
            "checkpoint": {"exportHf": False},
        }
    )
    with pytest.raises(StepTimeoutError) as failed:
        run_job(job, tmp_path, demo_base_dir(), progress=False)
    assert str(failed.value) == (
        "step 1 did not finish within spec.training.stepTimeoutSeconds (10 s): still waiting for the reward pool "
        "(0 of 64 samples scored); no checkpoint was saved"
    )
