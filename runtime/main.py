"""`kuberl run job.yaml` and `python -m kuberl.runtime --spec job.yaml`: run an RLJob.

Locally it starts its own Ray; inside a RayJob (RAY_ADDRESS set by KubeRay) or with
`--address` it joins the cluster. Everything the run writes goes under one output folder.
"""

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.api import ManifestError, RLJob, load_rljob_file

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
    for pool in (resources.critic, resources.reference, resources.reward):
        if pool is not None:
            total += pool.cpus * pool.replicas
    return total + (1.0 if resources.reward is None else 0.0)


def run_job(
    job: RLJob, output_dir: Path, base_dir: Path, address: str | None = None, progress: bool = True
) -> RunResult:
    """Run `job` to the end; raises RunConfigError (and friends) on a job that cannot run."""
    import ray

    from kuberl.runtime.controller import Controller, Groups, StepResult
    from kuberl.runtime.metrics import RunReporter
    from kuberl.runtime.plan import make_plan
    from kuberl.runtime.workers.group import GroupResources, WorkerGroup
    from kuberl.runtime.workers.model_worker import ModelWorker, WorkerSetup
    from kuberl.runtime.workers.reward_worker import RewardWorker

    output_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(job, output_dir, base_dir, cache_dir())
    (output_dir / "job.yaml").write_text(_yaml(job.to_manifest()), encoding="utf-8")
    started_ray = start_ray(address, cpus_needed(job))
    spec = job.spec
    groups: list[WorkerGroup] = []
    try:
        actor_pool = spec.resources.actor
        actor_roles = ["actor", "rollout"]
        if spec.resources.reference is None and (spec.algorithm.kl.coef or 0) > 0:
            actor_roles.append("reference")
        if spec.models.critic is not None and spec.resources.critic is None:
            actor_roles.append("critic")
        actor = WorkerGroup(ModelWorker, "actor", GroupResources(actor_pool.replicas, actor_pool.cpus, actor_pool.gpus))
        groups.append(actor)
        reward_pool = spec.resources.reward
        reward = WorkerGroup(
            RewardWorker,
            "reward",
            GroupResources(reward_pool.replicas, reward_pool.cpus, reward_pool.gpus)
            if reward_pool
            else GroupResources(1, 0.5, 0),
        )
        groups.append(reward)
        master = ray.get(actor.workers[0].address.remote())
        threads = max(1, int(actor_pool.cpus))
        setup = WorkerSetup(
            job=job.to_manifest(),
            roles=tuple(actor_roles),
            model_paths=plan.model_paths,
            tokenizer_path=plan.model_paths["actor"],
            master_addr=master[0],
            master_port=master[1],
            total_steps=plan.total_steps,
            threads=threads,
        )
        pending = [w.setup.remote(setup) for w in actor.workers]
        reward.call("setup", spec.reward.to_manifest(), plan.model_paths.get("reward"))
        ray.get(pending)
        controller = Controller(plan, Groups(actor=actor, reward=reward))
        reporter = RunReporter(output_dir, plan.total_steps, show_progress=progress)

        def on_step(result: StepResult) -> None:
            reporter.log_step(result.step, result.epoch, result.metrics)

        try:
            controller.run(0, on_step)
        finally:
            plot = reporter.close()
        model_dir = None
        if spec.checkpoint.export_hf:
            target = output_dir / "model"
            exported = actor.call("export_hf", str(target), plan.model_paths["actor"])
            model_dir = Path(exported[0]) if exported[0] else None
        return RunResult(output_dir, plan.total_steps, reporter.history, model_dir, plot)
    finally:
        for group in groups:
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
    output = Path(args.output) if args.output else Path("runs") / job.metadata.name
    try:
        result = run_job(job, output, Path(args.spec).resolve().parent, address=args.address)
    except (RunConfigError, DataError, ModelNotFoundError, RewardConfigError) as error:
        print(f"kuberl run: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    first, last = result.history[0], result.history[-1]
    print(f"done: {result.steps} steps in {output}/")
    print(f"  reward {first.get('reward/mean', 0):.3f} -> {last.get('reward/mean', 0):.3f}")
    print(f"  metrics: {output / 'metrics.jsonl'}  plot: {result.plot}  tensorboard: {output / 'tensorboard'}")
    if result.model_dir:
        print(f"  model: {result.model_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kuberl.runtime", description="Run an RLJob.")
    parser.add_argument("--spec", required=True, help="RLJob YAML file")
    parser.add_argument("--output", help="output folder (default runs/<job name>/)")
    parser.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint (the default)")
    return run_from_cli(parser.parse_args(argv))
