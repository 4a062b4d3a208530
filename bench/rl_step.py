"""Where one RL step's time goes: rollout, reward, reference, old log-probs, correction, critic, update, sync.

    .venv/bin/python bench/rl_step.py                 # GRPO on the tiny demo model (2 actor ranks)
    .venv/bin/python bench/rl_step.py --ppo           # PPO with a critic (adds the critic stages)
    .venv/bin/python bench/rl_step.py --model small   # the ~25M-parameter tiny model

Runs the demo job for --steps steps on a local Ray and prints the mean time of each stage over
all steps but the first (which pays for warm-up), its share of the step, and tokens/s.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from kuberl.runtime.report.telemetry import STAGES  # every stage of the loop, in order (sleep included)

REPO = Path(__file__).resolve().parent.parent


def job_manifest(args: argparse.Namespace) -> dict:
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    spec = manifest["spec"]
    spec["models"]["actor"]["path"] = f"tiny://{args.model}"
    spec["training"]["totalSteps"] = args.steps
    spec["data"]["train"] = str(REPO / "examples" / spec["data"]["train"])
    spec["rollout"]["engine"] = args.engine
    spec["checkpoint"] = {"intervalSteps": None, "saveOnPreemption": True, "exportHf": False}
    if args.ppo:
        spec["algorithm"] = {"name": "ppo", "groupSize": 1}
        spec["models"]["critic"] = {}
        spec["data"]["batchSize"] = 64
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--model", default="demo", help="tiny model name: demo (~1M) or small (~25M)")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--ppo", action="store_true", help="PPO with a critic instead of GRPO")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from kuberl.api import parse_rljob
    from kuberl.runtime.driver import run_job

    job = parse_rljob(job_manifest(args))
    with tempfile.TemporaryDirectory() as out:
        run = run_job(job, Path(out), REPO / "examples", progress=False)
    steady = run.history[1:] or run.history
    step_time = statistics.mean(record["time/step"] for record in steady)
    print(
        f"{'algorithm':<14}{job.spec.algorithm.name.value} on tiny://{args.model}, engine {args.engine}, "
        f"{job.spec.resources.actor.world_size} actor ranks, {len(steady)} steps measured"
    )
    print(f"{'stage':<14}{'seconds':>9}{'share':>8}")
    for stage in STAGES:
        seconds = statistics.mean(record.get(f"time/{stage}", 0.0) for record in steady)
        print(f"{stage:<14}{seconds:>9.3f}{seconds / step_time:>8.1%}")
    print(f"{'step':<14}{step_time:>9.3f}{1:>8.0%}")
    tokens = statistics.mean(record["rollout/tokens"] for record in steady)
    rollout_rate = statistics.mean(record["throughput/rollout_tokens_per_second"] for record in steady)
    end_to_end = tokens / step_time
    print(f"generated tokens/step {tokens:.0f}; rollout {rollout_rate:.0f} tok/s; end to end {end_to_end:.0f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
