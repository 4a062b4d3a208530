"""The driver: one run of a job, from its plan to its last step and the exported model.

    result = run_job(job, output_dir, base_dir, restart=False)

1. `make_plan` checks everything that can be checked before anything is written or started (plan.py).
2. Where the run starts: fresh or from the latest committed checkpoint (`Checkpointing.start_point`, by
   the rule of checkpoint/policy.py `start_from`: a restart, `--resume`, always resumes).
3. Ray and the worker groups start where the topology places them (pools/launch.py), and the trainers
   load the checkpoint the run starts from.
4. The controller steps (loop/controller.py; loop/async_controller.py's when spec.rollout.maxStaleness >= 1); after
   each step `StepRecorder` writes the metrics (and hands them to Prometheus, telemetry.py, when a
   metrics port is set), saves when
   due (never after a NaN update), publishes the RLJob's status, stops the run after saving when SIGTERM
   arrived or Ray drains a node of a trainer rank (a worker pod asked to stop: checkpoint/preemption.py), and
   fails it (JobFailed, exit 70) when runtime/health.py says training cannot go on. A rank lost outright
   stops it resumable (deadline.py WorkerLost, exit 75) from the latest commit.
5. The final checkpoint (the last step always saves) is exported as a Hugging Face model, beside the
   checkpoints when they are on a claim or an object store (`export_location`): on a cluster the model
   must outlive the pods.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from kuberl.api import RLJob, contract
from kuberl.runtime.checkpoint import CheckpointRef, PreemptionWatcher
from kuberl.runtime.checkpoint.checkpointing import Checkpointing, CheckpointLocationError
from kuberl.runtime.checkpoint.locations import checkpoint_uri, export_location
from kuberl.runtime.checkpoint.preemption import DrainWatcher, stop_window_seconds
from kuberl.runtime.data import DataError
from kuberl.runtime.environments.registry import EnvironmentConfigError
from kuberl.runtime.health import RunHealth, RunStopped
from kuberl.runtime.loop.async_controller import AsyncController
from kuberl.runtime.loop.controller import Controller, StepResult
from kuberl.runtime.loop.plan import RunConfigError, RunPlan, make_plan
from kuberl.runtime.loop.validation import validation_status
from kuberl.runtime.models.resolve import ModelNotFoundError, default_cache_dir
from kuberl.runtime.objectstore import is_remote
from kuberl.runtime.pools.launch import Groups, start_groups, start_ray
from kuberl.runtime.pools.reward import RewardPool
from kuberl.runtime.report.metrics import RunReporter
from kuberl.runtime.report.status_publisher import StatusPublisher, status_metrics
from kuberl.runtime.report.telemetry import PrometheusExporter
from kuberl.runtime.report.tracking import Trackers, TrackingError, open_trackers
from kuberl.runtime.rewards.functions import RewardConfigError

log = logging.getLogger(__name__)


#: A job that cannot run as specified: the message names the field or file; no restart will help.
CONFIGURATION_ERRORS: tuple[type[Exception], ...] = (
    RunConfigError,
    CheckpointLocationError,
    DataError,
    ModelNotFoundError,
    RewardConfigError,
    TrackingError,
    EnvironmentConfigError,
)


@dataclass
class RunResult:
    output_dir: Path
    steps: int
    history: list[dict[str, Any]]
    model_uri: str | None  # the exported model: a folder, or an object-store URI (None: not exported)
    plot: Path | None

    @property
    def model_dir(self) -> Path | None:
        """The exported model's folder when it is one on this machine's filesystem (or a mounted claim)."""
        return Path(self.model_uri) if self.model_uri is not None and not is_remote(self.model_uri) else None


class Preempted(Exception):
    """SIGTERM arrived, or Ray drains a node of a trainer rank; the job saved what it had and stops to be resumed."""

    def __init__(self, step: int, checkpoint: CheckpointRef | None, reason: str = "a signal") -> None:
        super().__init__(f"preempted after step {step}: {reason}")
        self.step = step
        self.checkpoint = checkpoint
        self.reason = reason


def controller_for(plan: RunPlan, groups: Groups) -> Controller:
    """The synchronous loop, or with spec.rollout.maxStaleness >= 1 the one whose rollout runs ahead."""
    if plan.job.spec.rollout.max_staleness > 0:
        return AsyncController(plan, groups)
    return Controller(plan, groups)


class StepRecorder:
    """What happens after each step: metrics, a checkpoint when due, the RLJob's status, the stop on SIGTERM."""

    def __init__(
        self,
        plan: RunPlan,
        checkpointing: Checkpointing,
        reporter: RunReporter,
        publisher: StatusPublisher,
        preemption: PreemptionWatcher,
        health: RunHealth,
        reward: RewardPool,
        exporter: PrometheusExporter | None = None,
        trackers: Trackers | None = None,
        drains: DrainWatcher | None = None,
    ) -> None:
        self.plan = plan
        self.drains = drains
        self.exporter = exporter
        self.trackers = trackers or Trackers([])
        self.health = health
        self.reward = reward
        self.checkpointing = checkpointing
        self.reporter = reporter
        self.publisher = publisher
        self.preemption = preemption

    def __call__(self, result: StepResult) -> None:
        stop = self.stop_reason()  # read once: the save and the stop decide on the same answer
        preempted = stop is not None
        total = self.plan.total_steps
        final = result.step + 1 == total
        self.reporter.log_step(result.step, result.epoch, result.metrics)
        if self.exporter is not None:  # after metrics.jsonl has the step: a scrape never runs ahead of the file
            self.exporter.record(self.reporter.history[-1])
        self.trackers.record(self.reporter.history[-1])  # wandb and MLflow get the record metrics.jsonl just got
        failure = self.health.observe(result.step + 1, result.metrics, self.reward.last_failure, final=final)
        # never after a NaN step (keepLast would rotate out the good ones), nor of a step that fails the job (a
        # restart runs it again and judges it again, instead of finding a finished run to export)
        if failure is None and self.health.may_checkpoint:
            self.checkpointing.after_step(
                result.step,
                result.epoch,
                final=final,
                preempted=preempted,
                stopping=self.preemption,
                state=self.health.state(),
            )
        latest = self.checkpointing.latest
        self.export_checkpoint()
        progress = {
            "step": result.step + 1,
            "totalSteps": total,
            "epoch": result.epoch,
            "etaSeconds": self.reporter.eta_seconds(result.step),
        }
        validation = validation_status(result.metrics, result.step + 1)
        self.publisher.publish(
            progress, status_metrics(result.metrics), latest.to_status() if latest else None, validation
        )
        if failure is not None:
            raise failure
        if stop is not None and not final:
            raise Preempted(result.step + 1, latest, stop)

    def stop_reason(self) -> str | None:
        """Why to save and stop after this step: a signal, or a trainer's node that Ray drains; None: go on."""
        if self.preemption.requested:
            return self.preemption.signal_name or "a signal"
        drained = self.drains.draining() if self.drains is not None else None
        if drained is not None:
            log.warning("%s: saving a checkpoint after this step, then exiting", drained)
        return drained

    def before_training(self, metrics: dict[str, float]) -> None:
        """The validation before the first step (training.validateBeforeTraining): the record of step 0 in
        metrics.jsonl, TensorBoard and the trackers, and status.validation. Nothing trained, so nothing is saved
        and the run's health has nothing to judge."""
        self.reporter.log_before_training(metrics)
        if self.exporter is not None:
            self.exporter.record(self.reporter.history[-1])
        self.trackers.record(self.reporter.history[-1])
        progress = {"step": 0, "totalSteps": self.plan.total_steps, "epoch": 0, "etaSeconds": None}
        self.publisher.publish(progress, status_metrics(metrics), None, validation_status(metrics, 0))

    def export_checkpoint(self) -> None:
        """The latest committed checkpoint's step and time, for Prometheus."""
        latest = self.checkpointing.latest
        if self.exporter is not None and latest is not None:
            self.exporter.checkpoint_committed(latest.step, latest.time.timestamp())


def nodes_to_keep(groups: Groups) -> dict[str, list[str]]:
    """The nodes the run loses a step with, each with who runs there: every model rank's, and the driver's."""
    nodes = groups.model_nodes()
    nodes.setdefault(ray.get_runtime_context().get_node_id(), []).insert(0, "the driver")
    return nodes


def run_job(
    job: RLJob,
    output_dir: Path,
    base_dir: Path,
    address: str | None = None,
    progress: bool = True,
    *,
    restart: bool = False,
    metrics_port: int | None = None,
    rayjob: str | None = None,
) -> RunResult:
    """Run `job` to the end; `restart` marks a restart of the same run (it resumes whatever
    checkpoint.resume says). Raises on a job that cannot run (CONFIGURATION_ERRORS: reported as such to
    the operator, which then does not restart it), and `Preempted` after saving when SIGTERM arrives.
    With `metrics_port` (or $KUBERL_METRICS_PORT) the driver serves Prometheus metrics at /metrics while
    it runs. `rayjob` names the RayJob this run is, in its reports."""
    publisher = StatusPublisher.from_environment(rayjob=rayjob)
    try:
        return _run(job, output_dir, base_dir, address, progress, restart, metrics_port, publisher)
    except CONFIGURATION_ERRORS as error:
        publisher.report_configuration_error(str(error))
        raise
    finally:
        publisher.close()


def _run(
    job: RLJob,
    output_dir: Path,
    base_dir: Path,
    address: str | None,
    progress: bool,
    restart: bool,
    metrics_port: int | None,
    publisher: StatusPublisher,
) -> RunResult:
    plan = make_plan(job, output_dir, base_dir, default_cache_dir())  # every check before anything is written
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "job.yaml").write_text(_yaml(job.to_manifest()), encoding="utf-8")
    checkpointing = Checkpointing(job, output_dir, uid=os.environ.get(contract.JOB_UID_ENV) or None)
    resume_from = checkpointing.start_point(restart)  # before any actor: a refusal costs no compute
    trackers = open_trackers(job, output_dir, checkpoint_uri(job, output_dir.resolve()))  # a bad key fails here
    started_ray = start_ray(address, plan.topology)
    groups: Groups | None = None
    namespace = job.metadata.namespace or "default"
    exporter = PrometheusExporter.from_environment(job.metadata.name, namespace, plan.total_steps, metrics_port)
    if exporter is not None:
        log.info("serving Prometheus metrics at http://0.0.0.0:%d/metrics", exporter.port)
    try:
        with PreemptionWatcher(window_seconds=stop_window_seconds(os.environ)) as preemption:
            groups = start_groups(plan)
            drains = DrainWatcher(nodes_to_keep(groups))
            start_step = checkpointing.begin(groups, resume_from)
            reporter = RunReporter(
                output_dir,
                plan.total_steps,
                start_step=start_step,
                show_progress=progress,
                max_new_tokens=job.spec.max_response_tokens,  # an episode: maxEpisodeTokens
            )
            health = RunHealth.from_spec(job.spec)
            health.restore(checkpointing.resumed_state)  # the reward window of the checkpoint it resumes
            recorder = StepRecorder(
                plan, checkpointing, reporter, publisher, preemption, health, groups.reward, exporter, trackers, drains
            )
            recorder.export_checkpoint()  # the one resumed from
            try:
                controller = controller_for(plan, groups)
                before = controller.validate_before_training(start_step)
                if before is not None:
                    recorder.before_training(before)
                controller.run(start_step, recorder)
            except RunStopped as stop:  # a failure, or a lost rank; status.lastCheckpoint names the same one
                raise stop.with_checkpoint(checkpointing.latest) from None
            finally:
                plot = reporter.close()
        exported = checkpointing.export(export_location(job, output_dir)) if job.spec.checkpoint.export_hf else None
        if exported is not None:
            publisher.report_exported_model(exported)  # status.exportedModel: where the user finds it
        return RunResult(output_dir, plan.total_steps, reporter.history, exported, plot)
    finally:
        trackers.close()
        if exporter is not None:
            exporter.close()
        if groups is not None:
            groups.shutdown()
        if started_ray:
            ray.shutdown()


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
