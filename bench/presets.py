"""Does every algorithm preset learn? Each runs the demo task for --steps steps; start -> end reward.

    .venv/bin/python bench/presets.py                      # all nine presets, 20 steps each
    .venv/bin/python bench/presets.py --presets dapo gspo  # some of them
    .venv/bin/python bench/presets.py --quick              # 8 steps, as a smoke run

The demo job (examples/tiny-grpo.yaml: tiny://counter, the counting task, lr 5e-4, hf engine) with
`algorithm.name` set to each preset and nothing else changed, except where a preset cannot run the
demo as it is: ppo gets a critic (lr 3e-3, as the PPO integration test), and the presets with one
response per prompt (ppo, reinforce_pp, remax) get data.batchSize 32 so a step sees 32 responses
like the group presets' 32-128. "start" is the mean reward/mean over the first 3 steps, "end" over
the last 3. For dapo, reward/mean includes the overlong penalty; "score" columns give the reward
function's own score (reward/mean minus reward/overlong_penalty_mean) for every preset.
"""

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "ppo", "rloo", "reinforce_pp", "remax", "cispo"]
ONE_RESPONSE_PER_PROMPT = {"ppo", "reinforce_pp", "remax"}


def job_manifest(preset: str, steps: int) -> dict:
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    manifest["metadata"]["name"] = f"preset-{preset.replace('_', '-')}"
    spec = manifest["spec"]
    spec["algorithm"] = {"name": preset}
    spec["training"]["totalSteps"] = steps
    spec["data"]["train"] = str(REPO / "examples" / spec["data"]["train"])
    spec["checkpoint"] = {"intervalSteps": None, "saveOnPreemption": True, "exportHf": False}
    if preset in ONE_RESPONSE_PER_PROMPT:
        spec["data"]["batchSize"] = 32
    if preset == "ppo":
        spec["models"]["critic"] = {"optim": {"lr": 0.003}}
    return copy.deepcopy(manifest)


def score_of(record: dict) -> float:
    return record["reward/mean"] - record.get("reward/overlong_penalty_mean", 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--presets", nargs="+", default=PRESETS, choices=PRESETS)
    parser.add_argument("--quick", action="store_true", help="8 steps each")
    args = parser.parse_args()
    steps = 8 if args.quick else args.steps
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from kuberl.api import parse_rljob
    from kuberl.runtime.driver import run_job
    from kuberl.runtime.pools.launch import start_shared_ray

    start_shared_ray()
    rows = []
    try:
        for preset in args.presets:
            job = parse_rljob(job_manifest(preset, steps))
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as out:
                run = run_job(job, Path(out), REPO / "examples", progress=False)
            wall = time.perf_counter() - started
            history = run.history
            first, last = history[:3], history[-3:]
            start, end = (statistics.mean(r["reward/mean"] for r in part) for part in (first, last))
            start_score, end_score = (statistics.mean(score_of(r) for r in part) for part in (first, last))
            responses = statistics.mean(r["rollout/tokens"] / max(r["response/length_mean"], 1e-9) for r in history)
            rows.append((preset, job, start, end, start_score, end_score, responses, wall))
            print(f"{preset}: reward {start:.3f} -> {end:.3f} in {wall:.0f} s", file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    actor = rows[0][1].spec.models.actor.path if rows else "?"
    print(f"{steps} steps each on the demo task ({actor}, hf engine, 2 actor ranks)")
    header = ["preset", "estimator", "loss", "aggregation", "responses/step"]
    header += ["reward start", "end", "score start", "end", "rose", "s"]
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|---:|")
    for preset, job, start, end, start_score, end_score, responses, wall in rows:
        algorithm = job.spec.algorithm
        print(
            f"| {preset} | {algorithm.advantage_estimator} | {algorithm.policy_loss} | {algorithm.loss_aggregation} "
            f"| {responses:.0f} | {start:.3f} | {end:.3f} | {start_score:.3f} | {end_score:.3f} "
            f"| {'yes' if end_score > start_score else 'NO'} | {wall:.0f} |"
        )
    return 0 if all(row[5] > row[4] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
