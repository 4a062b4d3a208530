"""`kuberl run job.yaml` and `python -m kuberl.runtime --spec job.yaml`: run an RLJob.

The command line is api/contract.py's (the operator builds it, this parses it). Locally the run
starts its own Ray; inside a RayJob (RAY_ADDRESS set by KubeRay) or with `--address` it joins the
cluster. Everything the run writes goes under one output folder. The exit code tells the operator
what happened (contract.ExitCode): done, a configuration error no restart will fix, or stopped
after saving and resumable. The run itself is runtime/driver.py's.
"""

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from kuberl.api import ManifestError, load_rljob_file
from kuberl.api.contract import ExitCode, RuntimeArgs, parse_runtime_args


def run_from_cli(args: RuntimeArgs) -> int:
    from kuberl.runtime.data import DataError
    from kuberl.runtime.driver import Preempted, run_job
    from kuberl.runtime.health import JobFailed
    from kuberl.runtime.models.resolve import ModelNotFoundError
    from kuberl.runtime.plan import RunConfigError
    from kuberl.runtime.rewards.functions import RewardConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job = load_rljob_file(args.spec)
    except ManifestError as error:
        print(error, file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    output = Path(args.output) if args.output else Path("runs") / job.metadata.name
    try:
        result = run_job(job, output, Path(args.spec).resolve().parent, address=args.address, restart=args.resume)
    except (RunConfigError, DataError, ModelNotFoundError, RewardConfigError) as error:
        print(f"kuberl run: {error}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    except JobFailed as failure:
        print(f"kuberl run: the job failed: {failure}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    except Preempted as stop:
        where = stop.checkpoint.uri if stop.checkpoint else "nowhere (checkpoint.saveOnPreemption is false)"
        again = "run again" if job.spec.checkpoint.resume else "run again with --resume"
        print(f"kuberl run: stopped by a signal after step {stop.step}; saved to {where}; {again} to resume")
        return ExitCode.RESUMABLE
    if not result.history:
        print(f"nothing to do: {output} already holds the finished run ({result.steps} steps)")
        return ExitCode.SUCCESS
    from kuberl.runtime.metrics import REWARD_MEAN

    first, last = result.history[0], result.history[-1]
    print(f"done: {result.steps} steps in {output}/")
    print(f"  reward {first.get(REWARD_MEAN, 0):.3f} -> {last.get(REWARD_MEAN, 0):.3f}")
    print(f"  metrics: {output / 'metrics.jsonl'}  plot: {result.plot}  tensorboard: {output / 'tensorboard'}")
    if result.model_dir:
        print(f"  model: {result.model_dir}")
    return ExitCode.SUCCESS


def main(argv: Sequence[str] | None = None) -> int:
    return int(run_from_cli(parse_runtime_args(argv)))
