"""Benchmark a short job on warm model workers against the same job on new ones, in one Ray.

    .venv/bin/python bench/warm_workers.py [--steps 2] [--repeats 3]

A driver that runs one job after another (the test suite, a sweep) can keep the model workers of a run that
ended well for the next run of the same shape (runtime/workers/group.py `keep_workers_warm`). This runs the
demo job (examples/tiny-grpo.yaml, hf engine, two actor ranks) for `--steps` steps, alternating: *new*, with
every kept worker stopped first (the baseline: what each run costs without warm workers), and *warm*, on the
workers the run before left. Each row is the median of `--repeats` runs of the whole `run_job` call and of its
`start_groups` part (where the workers start, import torch and FSDP, load the model and join a process group);
the ratio is warm / new.
"""

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/warm_workers.py` puts bench/ first
    sys.path.append(str(REPO))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray

    import kuberl.runtime.driver as driver
    from kuberl.runtime.pools.launch import start_shared_ray
    from kuberl.runtime.workers.group import keep_workers_warm
    from tests.integration.runtime.jobs import demo_base_dir, demo_job

    starts: list[float] = []
    start_groups = driver.start_groups

    @functools.wraps(start_groups)
    def timed_start_groups(plan):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        groups = start_groups(plan)
        starts.append(time.perf_counter() - began)
        return groups

    driver.start_groups = timed_start_groups
    start_shared_ray()
    job = demo_job(**{"training.totalSteps": args.steps, "rollout.engine": "hf"})
    times: dict[str, list[float]] = {"new": [], "warm": []}
    setups: dict[str, list[float]] = {"new": [], "warm": []}
    try:
        with keep_workers_warm() as warm, tempfile.TemporaryDirectory() as scratch:
            driver.run_job(job, Path(scratch) / "first", demo_base_dir(), progress=False)  # imports, the model built
            for repeat in range(args.repeats):
                for kind in ("new", "warm"):
                    if kind == "new":
                        warm.stop_all()
                    began = time.perf_counter()
                    driver.run_job(job, Path(scratch) / f"{kind}-{repeat}", demo_base_dir(), progress=False)
                    times[kind].append(time.perf_counter() - began)
                    setups[kind].append(starts[-1])
    finally:
        ray.shutdown()
    load = os.getloadavg()[0]
    print(f"demo job, {args.steps} steps, hf engine, 2 actor ranks; median of {args.repeats}; load {load:.1f}")
    print(f"{'workers':8} {'run_job s':>10} {'start_groups s':>15}")
    for kind in ("new", "warm"):
        print(f"{kind:8} {statistics.median(times[kind]):10.2f} {statistics.median(setups[kind]):15.2f}")
    ratio = statistics.median(times["warm"]) / statistics.median(times["new"])
    setup_ratio = statistics.median(setups["warm"]) / statistics.median(setups["new"])
    print(f"warm / new: run_job {ratio:.2f}x, start_groups {setup_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
