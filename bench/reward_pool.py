"""The reward phase with a slow reward: a pool fixed at minReplicas, fixed at maxReplicas, and autoscaled.

    .venv/bin/python bench/reward_pool.py                       # 128 samples, 0.1 s each, 1..4 workers
    .venv/bin/python bench/reward_pool.py --samples 128 --max 8 --seconds-per-sample 0.05

Starts its own local Ray. The reward sleeps (a reward that waits on a service or a GPU, not on this
machine's CPUs), so the figures show the pool's scheduling and scaling, not CPU contention. Each row
is one burst through a fresh pool: the fixed pools start all their workers before the clock starts;
the autoscaled pool starts at minReplicas and pays for growing inside its figure. The last line is
how long the autoscaled pool took to shrink back to minReplicas once idle.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REWARD_MODULE = "kuberl_bench_slow_reward"
# The reward workers import it from a temporary folder put on their PYTHONPATH (not bench/ itself:
# bench/operator.py would shadow the standard library's `operator` there).
REWARD_SOURCE = """
import time

def slow_score(completion, sample):
    time.sleep({seconds!r})
    return float(sample["index"])
"""


def burst(n: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    return [f"prompt {i}" for i in range(n)], [f"response {i}" for i in range(n)], [{"index": i} for i in range(n)]


def run_burst(name: str, low: int, high: int, replicas: int, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from kuberl.api.resources import RoleResources
    from kuberl.api.topology import reward_group
    from kuberl.runtime.pools.autoscale import ScalePolicy
    from kuberl.runtime.pools.reward import RewardPool

    resources = RoleResources(replicas=replicas, minReplicas=low, maxReplicas=high, cpus=args.cpus)
    policy = ScalePolicy(target_wait_s=args.target_wait, idle_release_s=args.idle_release, start_timeout_s=120)
    manifest = {"function": f"{REWARD_MODULE}:slow_score", "batchSize": args.batch_size}
    pool = RewardPool(manifest, None, reward_group(resources), policy=policy)
    started_with = pool.size
    started = time.perf_counter()
    results = pool.score(*burst(args.samples))
    seconds = time.perf_counter() - started
    wrong = sum(result.score != i or result.error is not None for i, result in enumerate(results))
    if wrong:
        raise SystemExit(f"{name}: {wrong} samples scored wrongly; the pool is broken")
    metrics = pool.metrics()
    row = {
        "setup": name,
        "workers": f"{started_with} -> {int(metrics['reward/pool_size_peak'])}",
        "seconds": seconds,
        "samples_s": args.samples / seconds,
        "wait": metrics["reward/queue_wait_seconds"],
    }
    return row, pool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=2, help="reward.batchSize")
    parser.add_argument("--seconds-per-sample", type=float, default=0.1)
    parser.add_argument("--min", type=int, default=1, help="minReplicas")
    parser.add_argument("--max", type=int, default=4, help="maxReplicas")
    parser.add_argument("--cpus", type=float, default=0.2, help="CPUs per reward worker")
    parser.add_argument("--target-wait", type=float, default=0.2, help="ScalePolicy.target_wait_s")
    parser.add_argument("--idle-release", type=float, default=2.0, help="ScalePolicy.idle_release_s")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from kuberl.runtime.pools.launch import start_shared_ray

    module_dir = Path(tempfile.mkdtemp(prefix="kuberl-bench-"))
    (module_dir / f"{REWARD_MODULE}.py").write_text(REWARD_SOURCE.format(seconds=args.seconds_per_sample))
    start_shared_ray(
        num_cpus=max(2, int(args.cpus * args.max + 1.999)), runtime_env={"env_vars": {"PYTHONPATH": str(module_dir)}}
    )
    try:
        rows = []
        for name, low, high, replicas in [
            (f"min ({args.min})", args.min, args.min, args.min),
            (f"max ({args.max})", args.max, args.max, args.max),
        ]:
            row, pool = run_burst(name, low, high, replicas, args)
            pool.shutdown()
            rows.append(row)
        row, elastic = run_burst(f"autoscaled ({args.min}..{args.max})", args.min, args.max, args.min, args)
        rows.append(row)
        idle_from = time.perf_counter()
        while elastic.size > args.min and time.perf_counter() - idle_from < 60:
            time.sleep(0.05)
        shrink_s = time.perf_counter() - idle_from
        shrunk_to = elastic.size
        elastic.shutdown()
    finally:
        ray.shutdown()
        (module_dir / f"{REWARD_MODULE}.py").unlink()
        module_dir.rmdir()
    ideal = args.samples * args.seconds_per_sample
    print(
        f"{args.samples} samples, {args.seconds_per_sample:g} s each, batchSize {args.batch_size}: "
        f"{ideal:.1f} s of reward work"
    )
    print(f"{'setup':<20}{'workers':>10}{'seconds':>10}{'samples/s':>11}{'queue wait':>12}{'vs min':>8}")
    for row in rows:
        speedup = rows[0]["seconds"] / row["seconds"]
        print(
            f"{row['setup']:<20}{row['workers']:>10}{row['seconds']:>10.2f}{row['samples_s']:>11.1f}"
            f"{row['wait']:>11.2f}s{speedup:>7.2f}x"
        )
    print(
        f"autoscaled pool back to {shrunk_to} worker(s) {shrink_s:.1f} s after the burst "
        f"(idle release {args.idle_release:g} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
