"""`kuberl run job.yaml` and `python -m kuberl.runtime --spec job.yaml`: run an RLJob.

The command line is api/contract.py's (the operator builds it, this parses it). Locally the run
starts its own Ray; inside a RayJob (RAY_ADDRESS set by KubeRay) or with `--address` it joins the
cluster. Everything the run writes goes under one output folder. The exit code tells the operator
what happened (contract.ExitCode): done, a configuration error no restart will fix, or stopped
after saving and resumable. The run itself is runtime/driver.py's.
"""

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kuberl.api import ManifestError, load_rljob_file
from kuberl.api.contract import ExitCode, RuntimeArgs, parse_runtime_args


def run_from_cli(args: RuntimeArgs) -> int:
    from kuberl.runtime.checkpoint.locations import default_output_dir
    from kuberl.runtime.deadline import WorkerLost
    from kuberl.runtime.driver import CONFIGURATION_ERRORS, Preempted, run_job
    from kuberl.runtime.health import JobFailed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        job = load_rljob_file(args.spec)
    except ManifestError as error:
        print(error, file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    output = Path(args.output) if args.output else default_output_dir(job)
    started = time.monotonic()
    try:
        result = run_job(
            job,
            output,
            Path(args.spec).resolve().parent,
            address=args.address,
            restart=args.resume,
            metrics_port=args.metrics_port,
            rayjob=args.rayjob,
        )
    except CONFIGURATION_ERRORS as error:
        print(f"kuberl run: {error}", file=sys.stderr)
        return ExitCode.CONFIG_ERROR
    except JobFailed as failure:
        print(f"kuberl run: the job failed: {failure}", file=sys.stderr)
        return ExitCode.JOB_FAILED
    except WorkerLost as lost:
        again = "run again" if job.spec.checkpoint.resume else "run again with --resume"
        print(f"kuberl run: stopped: {lost}; {again} to resume", file=sys.stderr)
        return ExitCode.RESUMABLE
    except Preempted as stop:
        where = stop.checkpoint.uri if stop.checkpoint else "nowhere (checkpoint.saveOnPreemption is false)"
        again = "run again" if job.spec.checkpoint.resume else "run again with --resume"
        print(f"kuberl run: stopped ({stop.reason}) after step {stop.step}; saved to {where}; {again} to resume")
        return ExitCode.RESUMABLE
    if not result.history:
        print(f"nothing to do: {output} already holds the finished run ({result.steps} steps)")
        return ExitCode.SUCCESS
    print(f"done: {result.steps} steps in {time.monotonic() - started:.0f} s, in {output}/")
    for line in learning_summary(result.history, job.spec.max_response_tokens):
        print(f"  {line}")
    print(f"  metrics: {output / 'metrics.jsonl'}  plot: {result.plot}  tensorboard: {output / 'tensorboard'}")
    if result.model_uri:
        print(f"  model: {result.model_uri}")
    return ExitCode.SUCCESS


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
    from kuberl.runtime.report.telemetry import KL_MEAN, RESPONSE_LENGTH_MEAN, REWARD_MEAN

    last = history[-max(1, min(SUMMARY_STEPS, len(history) - 1)) :]

    def mean(key: str) -> float:
        values = [record[key] for record in last if key in record]
        return sum(values) / len(values) if values else float("nan")

    first = history[0]
    lines = [
        f"reward           {first.get(REWARD_MEAN, float('nan')):6.3f} -> {mean(REWARD_MEAN):<7.3f} "
        f"(step {first.get('step', 1)} -> mean of the last {len(last)} steps)",
        f"response length  {first.get(RESPONSE_LENGTH_MEAN, float('nan')):6.1f} -> "
        f"{mean(RESPONSE_LENGTH_MEAN):<7.1f} tokens (limit {max_new_tokens})",
    ]
    kls = [record[KL_MEAN] for record in history if KL_MEAN in record]
    if kls:  # no reference model, no KL
        lines.append(f"KL to reference  {kls[0]:6.3f} -> {mean(KL_MEAN):<7.3f} nats per token (at most {max(kls):.3f})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return int(run_from_cli(parse_runtime_args(argv)))
