"""The plan carries each model's location, checked on the driver, for the workers to resolve on their own nodes."""

import shutil
from pathlib import Path

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.runtime.loop.plan import make_plan
from kuberl.runtime.models.resolve import ModelLocation, ModelNotFoundError
from kuberl.runtime.models.tiny import build_tiny_model
from tests.conftest import REPO

DEMO = REPO / "examples" / "tiny-grpo.yaml"


@pytest.fixture
def manifest_dir(tmp_path: Path) -> Path:
    """A manifest's folder holding the demo's data and a critic model under models/critic."""
    folder = tmp_path / "job"
    (folder / "data").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "data" / "tiny-task.jsonl", folder / "data")
    build_tiny_model("demo", folder / "models" / "critic")
    return folder


def ppo_job(**models: object) -> object:
    manifest = yaml.safe_load(DEMO.read_text())
    spec = manifest["spec"]
    spec["algorithm"] = {"name": "ppo", "groupSize": 1}
    spec["models"] = {"actor": {"path": "tiny://demo"}, "critic": {"path": "models/critic"}} | models
    spec["reward"] = {"model": {"path": "tiny://reward-demo"}}
    return parse_rljob(manifest)


def test_the_plan_carries_locations_and_the_driver_builds_only_what_it_reads(manifest_dir, tmp_path) -> None:
    cache = tmp_path / "driver-cache"
    plan = make_plan(ppo_job(), tmp_path / "out", manifest_dir, cache)
    actor = ModelLocation("tiny://demo", "spec.models.actor.path")
    assert plan.models == {
        "actor": actor,
        "reference": actor,
        "critic": ModelLocation(str(manifest_dir / "models" / "critic"), "spec.models.critic.path"),  # absolute
        "reward": ModelLocation("tiny://reward-demo", "spec.reward.model.path"),
    }
    assert plan.tokenizer_location == actor
    # the actor's tokenizer and config are read here; the reward model is only checked, each worker builds it
    assert [folder.name.split("-")[0] for folder in (cache / "tiny").iterdir() if folder.is_dir()] == ["demo"]


@pytest.mark.parametrize(
    ("models", "reward_path", "field"),
    [
        ({"critic": {"path": "models/no-critic"}}, "tiny://reward-demo", r"spec\.models\.critic\.path: model folder"),
        ({"reference": {"path": "tiny://huge"}}, "tiny://reward-demo", r"spec\.models\.reference\.path: unknown tiny"),
        ({}, "tiny://huge", r"spec\.reward\.model\.path: unknown tiny model tiny://huge"),
    ],
)
def test_a_model_no_worker_could_resolve_fails_the_plan_naming_its_field(
    manifest_dir, tmp_path, models, reward_path, field
) -> None:
    job = ppo_job(**models)
    job.spec.reward.model.path = reward_path  # type: ignore[union-attr]
    with pytest.raises(ModelNotFoundError, match=field):
        make_plan(job, tmp_path / "out", manifest_dir, tmp_path / "cache")
