"""The driver: one run of a job, from its plan to its last step and the exported model.

    result = run_job(job, output_dir, base_dir, restart=False)

1. `make_plan` checks everything that can be checked before anything is written or started (plan.py).
2. Where the run starts: fresh or from the latest committed checkpoint (`Checkpointing.start_point`, by
   the rule of checkpoint/policy.py `start_from`: a restart, `--resume`, always resumes).
3. Ray and the worker groups start where the topology places them (workers/launch.py), and the trainers
   load the checkpoint the run starts from.
4. The controller steps (controller.py; async_rollout.py's when spec.rollout.maxStaleness >= 1); after
   each step `StepRecorder` writes the metrics (and hands them to Prometheus, telemetry.py, when a
   metrics port is set), saves when
   due (never after a NaN update), publishes the RLJob's status, stops the run after saving when SIGTERM
   arrived, and fails it (JobFailed, exit 70) when runtime/health.py says training cannot go on.
5. The final checkpoint (the last step always saves) is exported as a Hugging Face model, beside the
   checkpoints when they are on a claim or an object store (`export_location`): on a cluster the model
   must outlive the pods.
"""

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from kuberl.api import RLJob
from kuberl.api.contract import CHECKPOINT_MOUNT_DIR
from kuberl.runtime.async_rollout import AsyncController
from kuberl.runtime.checkpoint import CheckpointRef, CheckpointStore, PreemptionWatcher, should_save
from kuberl.runtime.checkpoint.policy import Start, start_from
from kuberl.runtime.checkpoint.preemption import stop_window_seconds
from kuberl.runtime.controller import Controller, StepResult
from kuberl.runtime.data import DataError
from kuberl.runtime.environments.registry import EnvironmentConfigError
from kuberl.runtime.health import JobFailed, RunHealth
from kuberl.runtime.metrics import RunReporter
from kuberl.runtime.models.resolve import ModelNotFoundError, default_cache_dir
from kuberl.runtime.objectstore import is_remote
from kuberl.runtime.plan import RunConfigError, RunPlan, make_plan
from kuberl.runtime.rewards.functions import RewardConfigError
from kuberl.runtime.rewards.pool import RewardPool
from kuberl.runtime.status_publisher import StatusPublisher, status_metrics
from kuberl.runtime.telemetry import PrometheusExporter
from kuberl.runtime.tracking import Trackers, TrackingError, open_trackers
from kuberl.runtime.validation import validation_status
from kuberl.runtime.workers.launch import Groups, start_groups, start_ray

log = logging.getLogger(__name__)


#: A job that cannot run as specified: the message names the field or file; no restart will help.
CONFIGURATION_ERRORS: tuple[type[Exception], ...] = (
    RunConfigError,
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
    """SIGTERM arrived; the job saved what it had and stops to be resumed."""

    def __init__(self, step: int, checkpoint: CheckpointRef | None) -> None:
        super().__init__(f"preempted after step {step}")
        self.step = step
        self.checkpoint = checkpoint


def controller_for(plan: RunPlan, groups: Groups) -> Controller:
    """The synchronous loop, or with spec.rollout.maxStaleness >= 1 the one whose rollout runs ahead."""
    if plan.job.spec.rollout.max_staleness > 0:
        return AsyncController(plan, groups)
    return Controller(plan, groups)


def job_folder_on_claim(job: RLJob) -> Path:
    """`<claim mount>/<namespace>/<name>`: one job's folder on a checkpoint claim, which jobs may share (RWX)."""
    return Path(CHECKPOINT_MOUNT_DIR) / (job.metadata.namespace or "default") / job.metadata.name


def checkpoint_uri(job: RLJob, output_dir: Path) -> str:
    """checkpoint.uri as given (relative paths inside the output folder), the job's folder on its claim, or
    <output>/checkpoints."""
    ckpt = job.spec.checkpoint
    if ckpt.uri:
        if "://" in ckpt.uri or Path(ckpt.uri).is_absolute():
            return ckpt.uri
        return str(output_dir / ckpt.uri)
    if ckpt.pvc_claim_name:
        return str(job_folder_on_claim(job) / "checkpoints")
    return str(output_dir / "checkpoints")


def export_location(job: RLJob, output_dir: Path) -> str:
    """Where the final model is exported, so that it outlives the pods (rank 0's own disk does not): beside the
    checkpoints on an object store (`<checkpoint uri>/model`), in the job's folder on its claim
    (`<claim>/<namespace>/<name>/model`, where every pod mounts it), else in the output folder."""
    checkpoints = checkpoint_uri(job, output_dir)
    if is_remote(checkpoints):
        return checkpoints.rstrip("/") + "/model"
    if job.spec.checkpoint.pvc_claim_name:
        return str(job_folder_on_claim(job) / "model")
    return str(output_dir.resolve() / "model")  # absolute: rank 0 may run in another working directory


def default_output_dir(job: RLJob) -> Path:
    """runs/<job name>/, or the job's folder on its checkpoint claim when it has one: the exported model,
    metrics.jsonl and TensorBoard events then outlive the pod, on the claim beside the checkpoints."""
    return job_folder_on_claim(job) if job.spec.checkpoint.pvc_claim_name else Path("runs") / job.metadata.name


class Checkpointing:
    """The driver's side of checkpoint-resume: where to start, when to save, the commit, the export.

    `start_point` decides before any actor exists (a refusal costs nothing); `begin` loads the chosen
    checkpoint into the trainers once the groups are up.
    """

    def __init__(self, job: RLJob, output_dir: Path) -> None:
        self.job = job
        self.spec = job.spec.checkpoint
        self.store = CheckpointStore(checkpoint_uri(job, output_dir), self.spec.keep_last)
        self.groups: Groups | None = None
        self.last_step: int | None = None
        self.last_time = time.monotonic()
        self.latest: CheckpointRef | None = None
        self.last_save_seconds: float | None = None  # how long the last save took, for the stop window's outlook

    def start_point(self, restart: bool) -> CheckpointRef | None:
        """The checkpoint the run resumes from, None to start fresh; refuses to start over saved work."""
        ref = self.store.latest()
        if ref is not None:
            self.refuse_another_jobs(ref)
        start = start_from(ref is not None, self.spec, restart)
        if start == Start.REFUSE:
            assert ref is not None
            raise RunConfigError(
                f"spec.checkpoint.resume is false, but {self.store.uri} holds checkpoints up to step {ref.step}; "
                "point spec.checkpoint.uri (or --output) at an empty location, remove them, or pass --resume "
                "to carry on from them"
            )
        return ref if start == Start.RESUME else None

    def refuse_another_jobs(self, ref: CheckpointRef) -> None:
        """A location holding another RLJob's checkpoints is not resumed from, nor saved into."""
        theirs = self.store.job_of(ref)
        mine = (self.job.metadata.namespace, self.job.metadata.name)
        if theirs != mine:
            owner = "/".join(part for part in theirs if part) or "an unnamed job"
            raise RunConfigError(
                f"{self.store.uri} holds the checkpoints of RLJob {owner} (up to step {ref.step}), not of this "
                f"job ({'/'.join(part for part in mine if part)}); give this job a location of its own "
                "(spec.checkpoint.uri, or --output)"
            )

    def begin(self, groups: Groups, ref: CheckpointRef | None) -> int:
        """Load `ref` into every trainer of `groups`; the step to start from (0: fresh)."""
        self.groups = groups
        if ref is None:
            return 0
        for group in groups.trainers:
            group.call("load_checkpoint", ref.uri)
        state = self.store.load_train_state(ref)
        self.last_step, self.latest = int(state["step"]), ref
        log.info("resumed from the checkpoint of step %d: %s", self.last_step, ref.uri)
        return self.last_step

    def after_step(
        self, step: int, epoch: int, *, final: bool, preempted: bool, stopping: PreemptionWatcher | None = None
    ) -> None:
        done = step + 1
        if not should_save(done, self.last_step, self.last_time, time.monotonic(), self.spec, final, preempted):
            return
        if preempted and stopping is not None:
            stopping.warn_if_the_save_may_not_fit(self.last_save_seconds, self.last_step)
        started = time.monotonic()
        location = self.store.begin(done)
        assert self.groups is not None
        for group in self.groups.trainers:  # each group's ranks write their own models' shards
            group.call("save_checkpoint", location)
        self.latest = self.store.commit(location, done, {"step": done, "epoch": epoch}, self.job.to_manifest())
        self.last_step, self.last_time = done, time.monotonic()
        self.last_save_seconds = self.last_time - started

    def export(self, destination: str) -> str | None:
        """The latest checkpoint's actor as a Hugging Face folder at `destination`, a path or an object-store
        URI (the last step always saves, so it is final); where it is, None without a checkpoint."""
        if self.latest is None or self.groups is None:
            return None
        exported: str = self.groups.actor.call("export_hf", self.latest.uri, destination)[0]
        log.info("exported the final model (step %d) as a Hugging Face model: %s", self.latest.step, exported)
        return exported


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
    ) -> None:
        self.plan = plan
        self.exporter = exporter
        self.trackers = trackers or Trackers([])
        self.health = health
        self.reward = reward
        self.checkpointing = checkpointing
        self.reporter = reporter
        self.publisher = publisher
        self.preemption = preemption

    def __call__(self, result: StepResult) -> None:
        preempted = self.preemption.requested  # read once: the save and the stop decide on the same answer
        total = self.plan.total_steps
        final = result.step + 1 == total
        self.reporter.log_step(result.step, result.epoch, result.metrics)
        if self.exporter is not None:  # after metrics.jsonl has the step: a scrape never runs ahead of the file
            self.exporter.record(self.reporter.history[-1])
        self.trackers.record(self.reporter.history[-1])  # wandb and MLflow get the record metrics.jsonl just got
        failure = self.health.observe(result.step + 1, result.metrics, self.reward.last_failure)
        if self.health.may_checkpoint:  # never after a NaN step: keepLast would rotate out the good ones
            self.checkpointing.after_step(
                result.step, result.epoch, final=final, preempted=preempted, stopping=self.preemption
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
        if preempted and not final:
            raise Preempted(result.step + 1, latest)

    def export_checkpoint(self) -> None:
        """The latest committed checkpoint's step and time, for Prometheus."""
        latest = self.checkpointing.latest
        if self.exporter is not None and latest is not None:
            self.exporter.checkpoint_committed(latest.step, latest.time.timestamp())


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
    checkpointing = Checkpointing(job, output_dir)
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
            start_step = checkpointing.begin(groups, resume_from)
            reporter = RunReporter(
                output_dir,
                plan.total_steps,
                start_step=start_step,
                show_progress=progress,
                max_new_tokens=job.spec.max_response_tokens,  # an episode: maxEpisodeTokens
            )
            health = RunHealth.from_spec(job.spec)
            recorder = StepRecorder(
                plan, checkpointing, reporter, publisher, preemption, health, groups.reward, exporter, trackers
            )
            recorder.export_checkpoint()  # the one resumed from
            try:
                controller_for(plan, groups).run(start_step, recorder)
            except JobFailed as failure:  # status.lastCheckpoint names the same one
                raise failure.with_checkpoint(checkpointing.latest) from None
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
