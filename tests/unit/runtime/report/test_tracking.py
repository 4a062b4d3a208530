"""spec.tracking at the edges the training run does not show: a tracker that cannot start names what is
missing, a restarted job continues its MLflow run, and a tracker that cannot log does not stop training."""

import logging
from pathlib import Path
from typing import Any

import pytest

from kuberl.api import parse_rljob
from kuberl.runtime.report.tracking import MLflowTracker, Trackers, TrackingError, open_trackers


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs seconds); each test has its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def job(minimal_manifest: dict, tracking: dict[str, Any], project: str = "kuberl-unit") -> Any:
    manifest = dict(minimal_manifest)
    manifest["spec"] = minimal_manifest["spec"] | {"tracking": {"project": project} | tracking}
    return parse_rljob(manifest)


def runs(uri: str, project: str) -> dict[str, dict[int, float]]:
    """{run id: {step: reward/mean}} of every run in the experiment `project`."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(project)
    found = client.search_runs([experiment.experiment_id])
    return {
        run.info.run_id: {m.step: m.value for m in client.get_metric_history(run.info.run_id, "reward/mean")}
        for run in found
    }


def test_wandb_online_without_a_key_fails_naming_the_variable(minimal_manifest, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(TrackingError, match=r"spec\.tracking\.wandb: mode online needs WANDB_API_KEY"):
        open_trackers(job(minimal_manifest, {"wandb": {}}), tmp_path, str(tmp_path / "checkpoints"))


def test_mlflow_without_a_server_fails_naming_the_field(minimal_manifest, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(TrackingError, match=r"spec\.tracking\.mlflow\.trackingUri is not set"):
        open_trackers(job(minimal_manifest, {"mlflow": {}}), tmp_path, str(tmp_path / "checkpoints"))


def test_a_restarted_job_continues_its_mlflow_run_and_a_fresh_one_starts_another(
    minimal_manifest, mlflow_uri: str, tmp_path: Path
) -> None:
    tracked = job(minimal_manifest, {"mlflow": {"trackingUri": mlflow_uri}}, project="restarts")
    checkpoints = str(tmp_path / "checkpoints")
    for step in (1, 2):  # the pod restarts after step 1 and resumes from the same checkpoints
        trackers = open_trackers(tracked, tmp_path, checkpoints)
        trackers.record({"step": step, "reward/mean": step / 10})
        trackers.close()
    assert list(runs(mlflow_uri, "restarts").values()) == [{1: 0.1, 2: 0.2}]

    trackers = open_trackers(tracked, tmp_path, str(tmp_path / "elsewhere"))  # a fresh output folder
    trackers.record({"step": 1, "reward/mean": 0.7})
    trackers.close()
    assert sorted(runs(mlflow_uri, "restarts").values(), key=len) == [{1: 0.7}, {1: 0.1, 2: 0.2}]


def test_a_tracker_that_cannot_log_is_reported_and_training_goes_on(minimal_manifest, mlflow_uri, caplog) -> None:
    tracked = job(minimal_manifest, {"mlflow": {"trackingUri": mlflow_uri}}, project="failing")
    mlflow = MLflowTracker(tracked.spec.tracking, "minimal", "run-1")
    mlflow.client.delete_run(mlflow.run_id)  # MLflow now refuses every write to it
    trackers = Trackers([mlflow])
    with caplog.at_level(logging.WARNING, logger="kuberl.runtime.report.tracking"):
        trackers.record({"step": 3, "reward/mean": 0.5})  # does not raise
        trackers.close()
    assert "MLflowTracker could not log step 3" in caplog.text
