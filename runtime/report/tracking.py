"""Experiment trackers (spec.tracking): Weights & Biases and MLflow as sinks of the step record.

    trackers = open_trackers(job, output_dir)        # before any worker starts: a bad key fails here
    trackers.record(reporter.history[-1])            # the record metrics.jsonl just got, as it is
    trackers.close()

Each tracker receives the step record metrics.jsonl holds — every numeric key under its own name, at
the record's `step` — and keeps no names of its own (DESIGN.md: one step record, many readers). The
record's `epoch` is logged like any metric, as verl's trackers do.

MLflow refuses some characters in metric names; `mlflow_name` spells them out as verl's MLflow logger does
(`val/mean@8` -> `val/mean_at_8`), the one place a tracker's names differ from the record's.

A run is identified by the job and its checkpoint location, hashed: a job that restarts or resumes
from the same checkpoints continues the same tracker run, and a fresh output folder starts a new one.
MLflow finds its run again by the tag `kuberl.runId`; wandb by its run id (resume="allow"). wandb
drops a step it has already seen, so the steps a crashed run logged after its last checkpoint keep
their first values there; MLflow keeps both values of such a step.

Credentials are read from the environment (spec.secretRefs): WANDB_API_KEY for wandb online, and
MLflow's own MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD. A missing key fails the start, naming it.
"""

import hashlib
import logging
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from kuberl.api import RLJob
from kuberl.api.tracking import TrackingSpec, WandbMode

log = logging.getLogger(__name__)

#: The tag that finds a job's MLflow run again after a restart.
RUN_ID_TAG = "kuberl.runId"


class TrackingError(ValueError):
    """A tracker that cannot start; the message names the field or variable and what to do."""


class Tracker(Protocol):
    def record(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def tracked_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a step record as the trackers log them: every finite number except the step itself.

    >>> tracked_metrics({"step": 3, "epoch": 0, "reward/mean": 0.5, "note": "x", "kl/mean": float("nan")})
    {'epoch': 0.0, 'reward/mean': 0.5}
    """
    metrics = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool | str) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            metrics[key] = float(value)
    return metrics


def mlflow_name(key: str) -> str:
    """A step-record key as MLflow accepts it: `@` spelt `_at_`, any other character MLflow refuses as `_`.

    >>> mlflow_name("val/mean@8"), mlflow_name("reward/mean"), mlflow_name("time/a+b")
    ('val/mean_at_8', 'reward/mean', 'time/a_b')
    """
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key.replace("@", "_at_"))


def run_identity(job: RLJob, checkpoint_location: str) -> str:
    """A stable id for the job's tracker run: its namespace, name and checkpoint location, hashed."""
    namespace = job.metadata.namespace or "default"
    digest = hashlib.sha256(f"{namespace}/{job.metadata.name}|{checkpoint_location}".encode()).hexdigest()
    return f"{job.metadata.name[:40]}-{digest[:12]}"


class WandbTracker:
    """A wandb run (online, or offline under <output>/wandb) that logs each step record."""

    def __init__(self, spec: TrackingSpec, run_name: str, run_id: str, output_dir: Path, config: dict) -> None:
        assert spec.wandb is not None
        if spec.wandb.mode == WandbMode.ONLINE and not os.environ.get("WANDB_API_KEY"):
            raise TrackingError(
                "spec.tracking.wandb: mode online needs WANDB_API_KEY in the environment; put it in a Secret and "
                "list the Secret in spec.secretRefs, or set spec.tracking.wandb.mode: offline"
            )
        import wandb

        output_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=spec.project,
            entity=spec.wandb.entity,
            name=run_name,
            id=run_id,
            resume="allow",
            tags=list(spec.tags),
            config=config,
            dir=str(output_dir),
            mode="online" if spec.wandb.mode == WandbMode.ONLINE else "offline",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )

    def record(self, record: Mapping[str, Any]) -> None:
        self.run.log(tracked_metrics(record), step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


class MLflowTracker:
    """An MLflow run in the experiment `spec.project`, found again by its `kuberl.runId` tag."""

    def __init__(self, spec: TrackingSpec, run_name: str, run_id: str) -> None:
        assert spec.mlflow is not None
        uri = spec.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise TrackingError(
                "spec.tracking.mlflow.trackingUri is not set and MLFLOW_TRACKING_URI is not in the environment; "
                "name the tracking server (https://...) or a database store (sqlite:///path/mlflow.db)"
            )
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(spec.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(spec.project)
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'")
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {tag: "true" for tag in spec.tags} | {RUN_ID_TAG: run_id}
            self.run_id = self.client.create_run(experiment_id, tags=tags, run_name=run_name).info.run_id

    def record(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["step"]), int(time.time() * 1000)
        metrics = [Metric(mlflow_name(key), value, now, step) for key, value in tracked_metrics(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackers:
    """Every tracker spec.tracking names, fed together; a tracker that fails to log is logged, not fatal."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def record(self, record: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            try:
                tracker.record(record)
            except Exception as error:  # a tracker's server being down must not stop the training
                log.warning("%s could not log step %s: %s", type(tracker).__name__, record.get("step"), error)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as error:
                log.warning("%s did not close cleanly: %s", type(tracker).__name__, error)


def open_trackers(job: RLJob, output_dir: Path, checkpoint_location: str) -> Trackers:
    """The trackers of spec.tracking, started (none when it is not set); raises TrackingError naming what is
    missing. Each tracker's run is `tracking.runName` (default: the job's name)."""
    spec = job.spec.tracking
    if spec is None:
        return Trackers([])
    name = spec.run_name or job.metadata.name
    identity = run_identity(job, checkpoint_location)
    trackers: list[Tracker] = []
    try:
        if spec.wandb is not None:
            trackers.append(WandbTracker(spec, name, identity, output_dir, job.spec.to_manifest()))
        if spec.mlflow is not None:
            trackers.append(MLflowTracker(spec, name, identity))
    except BaseException:
        Trackers(trackers).close()
        raise
    return Trackers(trackers)
