"""`kuberl run job.yaml` and `python -m kuberl.runtime --spec job.yaml`: run an RLJob.

Locally it starts its own Ray; inside a RayJob (RAY_ADDRESS set by KubeRay) or with
`--address` it joins the cluster. Everything the run writes goes under one output folder.
"""

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.api import ManifestError, RLJob, RolloutMode, load_rljob_file

log = logging.getLogger("kuberl.runtime")
EXIT_CONFIG_ERROR = 1
#: The job stopped early (preemption) after saving: restart it and it resumes. (sysexits EX_TEMPFAIL)
EXIT_RESUMABLE = 75


@dataclass
class RunResult:
    output_dir: Path
    steps: int
    history: list[dict[str, Any]]
    model_dir: Path | None
    plot: Path | None


def cache_dir() -> Path:
    return Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl"))


def start_ray(address: str | None, cpus_needed: float) -> bool:
    """Join a cluster or start a local Ray; True when this call started it (and must stop it)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or "auto", log_to_driver=True)
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        num_cpus=max(os.cpu_count() or 1, int(cpus_needed + 0.999)),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return True


def cpus_needed(job: RLJob) -> float:
    resources = job.spec.resources
    total = resources.actor.cpus * resources.actor.world_size
    for pool in (resources.critic, resources.reference, resources.rollout):
        if pool is not None:
            total += pool.cpus * pool.replicas
    # the reward pool may grow to its maximum; locally those workers need room too
    return total + (resources.reward.cpus * resources.reward.effective_max if resources.reward else 0.5)


class Preempted(Exception):
    """SIGTERM arrived; the job saved what it had and stops to be resumed."""

    def __init__(self, step: int, checkpoint: Any) -> None:
        super().__init__(f"preempted after step {step}")
        self.step = step
        self.checkpoint = checkpoint


#: Where the operator mounts checkpoint.pvcClaimName in every pod (operator/names.py CHECKPOINT_MOUNT_DIR).
CLAIM_MOUNT = "/checkpoints"


def checkpoint_uri(job: RLJob, output_dir: Path) -> str:
    """checkpoint.uri as given (relative paths inside the output folder), the claim's mount, or <output>/checkpoints."""
    ckpt = job.spec.checkpoint
    if ckpt.uri:
        if "://" in ckpt.uri or Path(ckpt.uri).is_absolute():
            return ckpt.uri
        return str(output_dir / ckpt.uri)
    if ckpt.pvc_claim_name:
        return CLAIM_MOUNT
    return str(output_dir / "checkpoints")


def default_output_dir(job: RLJob) -> Path:
    """runs/<job name>/, or the checkpoint claim's mount when the job has one: the exported model, metrics.jsonl
    and TensorBoard events then outlive the pod, on the claim beside the checkpoints."""
    return Path(CLAIM_MOUNT) if job.spec.checkpoint.pvc_claim_name else Path("runs") / job.metadata.name


def start_rollout_pool(job: RLJob, plan: Any) -> Any:
    """rollout.mode separate: a pool of engine replicas of its own (weight version 0 = the initial model)."""
    from kuberl.runtime.workers.group import GroupResources, WorkerGroup
    from kuberl.runtime.workers.rollout_worker import RolloutWorker

    pool = job.spec.resources.rollout
    assert pool is not None  # the API refuses separate mode without resources.rollout
    group = WorkerGroup(
        RolloutWorker, "rollout", GroupResources(pool.replicas, pool.cpus, pool.gpus, worker_per_replica=True)
    )
    try:
        group.call(
            "setup", job.to_manifest(), plan.model_paths["actor"], plan.model_paths["actor"], int(pool.cpus) or 1
        )
    except BaseException:
        group.kill()
        raise
    return group


def start_groups(job: RLJob, plan: Any) -> tuple[Any, Any]:
    """The actor group (with its colocated roles), set up, and the elastic reward pool."""
    import ray

    from kuberl.runtime.rewards.pool import RewardPool
    from kuberl.runtime.workers.group import GroupResources, WorkerGroup
    from kuberl.runtime.workers.model_worker import ModelWorker, WorkerSetup

    spec = job.spec
    actor_pool = spec.resources.actor
    roles = ["actor"] if spec.rollout.mode == RolloutMode.SEPARATE else ["actor", "rollout"]
    if spec.resources.reference is None and (spec.algorithm.kl.coef or 0) > 0:
        roles.append("reference")
    if spec.models.critic is not None and spec.resources.critic is None:
        roles.append("critic")
    actor = WorkerGroup(ModelWorker, "actor", GroupResources(actor_pool.replicas, actor_pool.cpus, actor_pool.gpus))
    master_addr, master_port = ray.get(actor.workers[0].address.remote())
    setup = WorkerSetup(
        job=job.to_manifest(),
        roles=tuple(roles),
        model_paths=plan.model_paths,
        tokenizer_path=plan.model_paths["actor"],
        master_addr=master_addr,
        master_port=master_port,
        total_steps=plan.total_steps,
        threads=max(1, int(actor_pool.cpus)),
    )
    pending = [worker.setup.remote(setup) for worker in actor.workers]
    try:
        reward = RewardPool(spec.reward.to_manifest(), plan.model_paths.get("reward"), spec.resources.reward)
        ray.get(pending)
    except BaseException:
        actor.kill()
        raise
    return actor, reward


class Checkpointing:
    """The driver's side of checkpoint-resume: when to save, the commit, what to resume from."""

    def __init__(self, job: RLJob, output_dir: Path, actor: Any) -> None:
        from kuberl.runtime.checkpoint import CheckpointStore

        self.job = job
        self.spec = job.spec.checkpoint
        self.actor = actor
        self.store = CheckpointStore(checkpoint_uri(job, output_dir), self.spec.keep_last)
        self.last_step: int | None = None
        self.last_time = time.monotonic()
        self.latest: Any = None

    def resume(self) -> int:
        """Load the newest complete checkpoint into the workers; the step to start from (0 for a fresh run)."""
        ref = self.store.latest()
        if ref is None:
            return 0
        if not self.spec.resume:
            from kuberl.runtime.plan import RunConfigError

            raise RunConfigError(
                f"spec.checkpoint.resume is false, but {self.store.uri} holds checkpoints up to step {ref.step}; "
                "point spec.checkpoint.uri (or --output) at an empty location, or remove them"
            )
        self.actor.call("load_checkpoint", ref.uri)
        state = self.store.load_train_state(ref)
        self.last_step, self.latest = int(state["step"]), ref
        log.info("resumed from the checkpoint of step %d: %s", self.last_step, ref.uri)
        return self.last_step

    def after_step(self, step: int, epoch: int, *, final: bool, preempted: bool) -> None:
        from kuberl.runtime.checkpoint import should_save

        done = step + 1
        if not should_save(done, self.last_step, self.last_time, time.monotonic(), self.spec, final, preempted):
            return
        location = self.store.begin(done)
        self.actor.call("save_checkpoint", location)
        self.latest = self.store.commit(location, done, {"step": done, "epoch": epoch}, self.job.to_manifest())
        self.last_step, self.last_time = done, time.monotonic()


def run_job(
    job: RLJob,
    output_dir: Path,
    base_dir: Path,
    address: str | None = None,
    progress: bool = True,
    metrics_port: int | None = None,
) -> RunResult:
    """Run `job` to the end, resuming from its latest checkpoint; raises on a job that cannot run, and
    `Preempted` after saving when SIGTERM arrives. With `metrics_port` (or $KUBERL_METRICS_PORT) the
    driver serves Prometheus metrics at /metrics while it runs."""
    import ray

    from kuberl.runtime.checkpoint import PreemptionWatcher
    from kuberl.runtime.controller import Controller, Groups, StepResult
    from kuberl.runtime.metrics import RunReporter
    from kuberl.runtime.plan import make_plan
    from kuberl.runtime.status_publisher import StatusPublisher, status_metrics
    from kuberl.runtime.telemetry import PrometheusExporter
    from kuberl.runtime.validation import validation_status

    plan = make_plan(job, output_dir, base_dir, cache_dir())  # every check before anything is written
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "job.yaml").write_text(_yaml(job.to_manifest()), encoding="utf-8")
    started_ray = start_ray(address, cpus_needed(job))
    actor: Any = None
    reward: Any = None
    rollout: Any = None
    publisher = StatusPublisher.from_environment()
    exporter = PrometheusExporter.from_environment(
        job.metadata.name, job.metadata.namespace or "default", plan.total_steps, metrics_port
    )
    if exporter is not None:
        log.info("serving Prometheus metrics at http://0.0.0.0:%d/metrics", exporter.port)
    try:
        with PreemptionWatcher() as preemption:
            actor, reward = start_groups(job, plan)
            if job.spec.rollout.mode == RolloutMode.SEPARATE:
                rollout = start_rollout_pool(job, plan)
            checkpointing = Checkpointing(job, output_dir, actor)
            start_step = checkpointing.resume()
            controller = Controller(plan, Groups(actor=actor, reward=reward, rollout=rollout))
            reporter = RunReporter(
                output_dir,
                plan.total_steps,
                start_step=start_step,
                show_progress=progress,
                max_new_tokens=job.spec.rollout.max_new_tokens,
            )

            def export_checkpoint() -> None:
                if exporter is not None and checkpointing.latest is not None:
                    exporter.checkpoint_committed(checkpointing.latest.step, checkpointing.latest.time.timestamp())

            export_checkpoint()

            def on_step(result: StepResult) -> None:
                reporter.log_step(result.step, result.epoch, result.metrics)
                if exporter is not None:  # after metrics.jsonl has the step: a scrape never runs ahead of the file
                    exporter.record(reporter.history[-1])
                final = result.step + 1 == plan.total_steps
                checkpointing.after_step(result.step, result.epoch, final=final, preempted=preemption.requested)
                export_checkpoint()
                latest = checkpointing.latest.to_status() if checkpointing.latest else None
                progress_status = {
                    "step": result.step + 1,
                    "totalSteps": plan.total_steps,
                    "epoch": result.epoch,
                    "etaSeconds": reporter.eta_seconds(result.step),
                }
                validation = validation_status(result.metrics, result.step + 1)
                publisher.publish(progress_status, status_metrics(result.metrics), latest, validation)
                if preemption.requested and not final:
                    raise Preempted(result.step + 1, checkpointing.latest)

            try:
                controller.run(start_step, on_step)
            finally:
                plot = reporter.close()
        model_dir = None
        if job.spec.checkpoint.export_hf:
            exported = actor.call("export_hf", str(output_dir / "model"), plan.model_paths["actor"])
            model_dir = Path(exported[0]) if exported[0] else None
        return RunResult(output_dir, plan.total_steps, reporter.history, model_dir, plot)
    finally:
        publisher.close()
        if exporter is not None:
            exporter.close()
        if reward is not None:
            reward.shutdown()
        for group in (actor, rollout):
            if group is not None:
                group.kill()
        if started_ray:
            ray.shutdown()


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def run_from_cli(args: argparse.Namespace) -> int:
    from kuberl.runtime.data import DataError
    from kuberl.runtime.models.resolve import ModelNotFoundError
    from kuberl.runtime.plan import RunConfigError
    from kuberl.runtime.rewards.functions import RewardConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job = load_rljob_file(args.spec)
    except ManifestError as error:
        print(error, file=sys.stderr)
        return EXIT_CONFIG_ERROR
    output = Path(args.output) if args.output else default_output_dir(job)
    started = time.monotonic()
    try:
        result = run_job(
            job,
            output,
            Path(args.spec).resolve().parent,
            address=args.address,
            metrics_port=getattr(args, "metrics_port", None),
        )
    except (RunConfigError, DataError, ModelNotFoundError, RewardConfigError) as error:
        print(f"kuberl run: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except Preempted as stop:
        where = stop.checkpoint.uri if stop.checkpoint else "nowhere (checkpoint.saveOnPreemption is false)"
        print(f"kuberl run: stopped by a signal after step {stop.step}; saved to {where}; run again to resume")
        return EXIT_RESUMABLE
    if not result.history:
        print(f"nothing to do: {output} already holds the finished run ({result.steps} steps)")
        return 0
    print(f"done: {result.steps} steps in {time.monotonic() - started:.0f} s, in {output}/")
    for line in learning_summary(result.history, job.spec.rollout.max_new_tokens):
        print(f"  {line}")
    print(f"  metrics: {output / 'metrics.jsonl'}  plot: {result.plot}  tensorboard: {output / 'tensorboard'}")
    if result.model_dir:
        print(f"  model: {result.model_dir}")
    return 0


#: Steps averaged at the end of a run in the final summary (one step's mean reward is noisy).
SUMMARY_STEPS = 5


def learning_summary(history: list[dict[str, Any]], max_new_tokens: int) -> list[str]:
    """What the run learned: the first step (the model as it started) against the mean of the last steps.

    >>> history = [{"reward/mean": 0.4, "response/length_mean": 8.0, "kl/mean": 0.0},
    ...            {"reward/mean": 0.9, "response/length_mean": 4.0, "kl/mean": 0.7},
    ...            {"reward/mean": 1.0, "response/length_mean": 4.0, "kl/mean": 0.5}]
    >>> for line in learning_summary(history, 12): print(line)
    reward            0.400 -> 0.950   (step 1 -> mean of the last 2 steps)
    response length     8.0 -> 4.0     tokens (limit 12)
    KL to reference   0.000 -> 0.600   nats per token (at most 0.700)
    """
    last = history[-max(1, min(SUMMARY_STEPS, len(history) - 1)) :]

    def mean(key: str) -> float:
        values = [record[key] for record in last if key in record]
        return sum(values) / len(values) if values else float("nan")

    first = history[0]
    lines = [
        f"reward           {first.get('reward/mean', float('nan')):6.3f} -> {mean('reward/mean'):<7.3f} "
        f"(step {first.get('step', 1)} -> mean of the last {len(last)} steps)",
        f"response length  {first.get('response/length_mean', float('nan')):6.1f} -> "
        f"{mean('response/length_mean'):<7.1f} tokens (limit {max_new_tokens})",
    ]
    kls = [record["kl/mean"] for record in history if "kl/mean" in record]
    if kls:  # no reference model, no KL
        lines.append(
            f"KL to reference  {kls[0]:6.3f} -> {mean('kl/mean'):<7.3f} nats per token (at most {max(kls):.3f})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kuberl.runtime", description="Run an RLJob.")
    parser.add_argument("--spec", required=True, help="RLJob YAML file")
    parser.add_argument("--output", help="output folder (default runs/<job name>/)")
    parser.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint (the default)")
    parser.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics at :PORT/metrics (default: $KUBERL_METRICS_PORT)"
    )
    return run_from_cli(parser.parse_args(argv))
