"""Synchronous against asynchronous rollout (spec.rollout.maxStaleness) on the demo task, same seeds, alternating.

    .venv/bin/python bench/async.py                 # 30 steps per configuration, 1 round (~6 min here)
    .venv/bin/python bench/async.py --steps 10      # a smoke run
    .venv/bin/python bench/async.py --rounds 2 --target 0.9

The job: examples/tiny-grpo.yaml (tiny://counter, the counting task, GRPO, 8 prompts x 8 responses, hf
engine), with algorithm.rolloutCorrection {importanceSampling: token} in every configuration (the same
algorithm everywhere: in the synchronous rows it corrects for the engine-trainer gap only). Each
configuration runs as `kuberl run` in a subprocess of its own, configurations alternating in every round.

How the 2 cores are split (each configuration gets both, in total):
  sync-colocated   2 actor ranks x 1 CPU (FSDP2 over gloo), the engine in the actor's ranks: the demo's layout
  sync-separate    1 actor rank x 1 CPU + 1 rollout replica x 1 CPU, maxStaleness 0: one side idles while
                   the other works (the synchronous loop)
  async-k1/k2      the same split, maxStaleness 1 / 2: the replica generates while the actor trains

Printed per configuration (medians over every step but the first of all rounds): wall seconds per step
(the interval between consecutive lines of metrics.jsonl, seen by polling it: everything a step costs),
steps/s, generated tokens per wall second, the per-stage split (time/rollout and time/reward on the pool's
side; time/reference .. time/sync on the trainer's), the idle fractions of each side (async rows), peak
memory (summed RSS of the run's process tree, sampled every 2 s), the mean reward of the first and the
last 3 steps, and the wall time from the first step's end (and the steps) to the first step whose
3-step mean reward reaches --target. Then each row's steps/s against sync-colocated's. A PNG of reward
against wall-clock time for every configuration is written next to the output folder (reward_vs_time.png).

TRL is not in this comparison yet (it is not installed in the project's environment; bench/vs_trl.py
measures it against the synchronous loop).
"""

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS: dict[str, dict] = {
    "sync-colocated": {"resources": {"actor": {"replicas": 2, "cpus": 1}}},
    "sync-separate": {
        "rollout": {"placement": "separate", "maxStaleness": 0},
        "resources": {"actor": {"replicas": 1, "cpus": 1}, "rollout": {"replicas": 1, "cpus": 1}},
    },
    "async-k1": {
        "rollout": {"placement": "separate", "maxStaleness": 1},
        "resources": {"actor": {"replicas": 1, "cpus": 1}, "rollout": {"replicas": 1, "cpus": 1}},
    },
    "async-k2": {
        "rollout": {"placement": "separate", "maxStaleness": 2},
        "resources": {"actor": {"replicas": 1, "cpus": 1}, "rollout": {"replicas": 1, "cpus": 1}},
    },
}
POOL_STAGES = ("rollout", "reward")
TRAINER_STAGES = ("reference", "old_logprobs", "correction", "advantages", "update", "sync")


def job_manifest(name: str, steps: int) -> dict:
    manifest = yaml.safe_load((REPO / "examples" / "tiny-grpo.yaml").read_text())
    manifest["metadata"]["name"] = f"async-bench-{name}"
    spec = manifest["spec"]
    spec["training"]["totalSteps"] = steps
    spec["data"]["train"] = str(REPO / "examples" / spec["data"]["train"])
    spec["algorithm"]["rolloutCorrection"] = {"importanceSampling": "token"}
    spec["checkpoint"] = {"intervalSteps": None, "saveOnPreemption": True, "exportHf": False}
    for section, values in CONFIGS[name].items():
        for key, value in values.items():
            spec.setdefault(section, {})[key] = copy.deepcopy(value)
    return manifest


@dataclass
class Run:
    name: str
    records: list[dict] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)  # wall time each step's line appeared (s since start)
    peak_rss: float = 0.0
    seconds: float = 0.0


def tree_rss(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_one(name: str, steps: int, folder: Path) -> Run:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / f"{name}.yaml"
    job.write_text(yaml.safe_dump(job_manifest(name, steps)))
    output = folder / name
    metrics = output / "metrics.jsonl"
    kuberl = Path(sys.executable).parent / "kuberl"
    run = Run(name)
    started = time.monotonic()
    child = subprocess.Popen(
        [str(kuberl), "run", str(job), "--output", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    stop = threading.Event()

    def sample_memory() -> None:
        while not stop.wait(2.0):
            run.peak_rss = max(run.peak_rss, tree_rss(child.pid))

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    seen = 0
    while child.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        now = time.monotonic() - started
        run.ends.extend([now] * (len(lines) - seen))
        seen = len(lines)
        time.sleep(0.05)
    stop.set()
    _, errors = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"{name} failed ({child.returncode}):\n{errors.decode()[-3000:]}")
    lines = metrics.read_text().splitlines()
    run.ends.extend([time.monotonic() - started] * (len(lines) - seen))
    run.records = [json.loads(line) for line in lines]
    run.seconds = time.monotonic() - started
    return run


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def target_step(run: Run, target: float) -> int | None:
    """The index of the first step whose 3-step mean reward (it and the two before) reaches `target`."""
    rewards = [record["reward/mean"] for record in run.records]
    for i in range(2, len(rewards)):
        if statistics.fmean(rewards[i - 2 : i + 1]) >= target:
            return i
    return None


def summarise(runs: list[Run], target: float) -> dict[str, float | None]:
    walls = [b - a for run in runs for a, b in zip(run.ends, run.ends[1:], strict=False)]
    tokens = [r["rollout/tokens"] for run in runs for r in run.records[1:]]
    wall = median(walls)
    row: dict[str, float | None] = {
        "wall_s": wall,
        "steps_per_s": 1.0 / wall,
        "tokens_per_s": median(tokens) / wall,
        "peak_gib": max(run.peak_rss for run in runs) / 2**30,
        "reward_start": statistics.fmean(statistics.fmean(r["reward/mean"] for r in run.records[:3]) for run in runs),
        "reward_end": statistics.fmean(statistics.fmean(r["reward/mean"] for r in run.records[-3:]) for run in runs),
    }
    for stage in (*POOL_STAGES, *TRAINER_STAGES):
        row[stage] = median([r.get(f"time/{stage}", 0.0) for run in runs for r in run.records[1:]])
    for key in ("async/rollout_idle_fraction", "async/trainer_idle_fraction", "async/staleness_mean"):
        values = [r[key] for run in runs for r in run.records[1:] if key in r]
        row[key] = median(values) if values else None
    reached = [target_step(run, target) for run in runs]
    row["to_target_s"] = row["to_target_steps"] = None
    if all(i is not None for i in reached):
        pairs = zip(runs, reached, strict=True)
        row["to_target_s"] = statistics.fmean(run.ends[i] - run.ends[0] for run, i in pairs if i)
        row["to_target_steps"] = statistics.fmean(i + 1 for i in reached if i)
    return row


def plot(runs: dict[str, list[Run]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for name, repeats in runs.items():
        for i, run in enumerate(repeats):
            start = run.ends[0]
            axes.plot(
                [end - start for end in run.ends],
                [r["reward/mean"] for r in run.records],
                label=name if i == 0 else None,
                color=f"C{list(runs).index(name)}",
            )
    axes.axhline(target, color="grey", linestyle=":", label=f"target {target}")
    axes.set_xlabel("wall-clock seconds since the first step ended")
    axes.set_ylabel("reward/mean")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.85, help="the mean reward (over 3 steps) to reach")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kuberl-async-bench-"))
    runs: dict[str, list[Run]] = {name: [] for name in args.configs}
    for round_index in range(args.rounds):
        for name in args.configs:
            run = run_one(name, args.steps, folder / f"round{round_index}")
            runs[name].append(run)
            print(f"round {round_index + 1} {name}: {run.seconds:.0f} s", flush=True)
    rows = {name: summarise(repeats, args.target) for name, repeats in runs.items()}
    base = rows[args.configs[0]]["steps_per_s"]
    print(f"\n{args.steps} steps x {args.rounds} round(s); target reward {args.target} (3-step mean)")
    header = "| config | s/step | steps/s | vs first | tok/s | to target s | steps | reward start | end | peak GiB |"
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        to_target = "not reached | -"
        if row["to_target_s"] is not None:
            to_target = f"{row['to_target_s']:.1f} | {row['to_target_steps']:.1f}"
        assert base is not None and row["steps_per_s"] is not None
        print(
            f"| {name} | {row['wall_s']:.2f} | {row['steps_per_s']:.2f} | {row['steps_per_s'] / base:.2f}x | "
            f"{row['tokens_per_s']:.0f} | {to_target} | {row['reward_start']:.3f} | {row['reward_end']:.3f} | "
            f"{row['peak_gib']:.1f} |"
        )
    print("\nper-stage medians (s); pool: rollout, reward; trainer: the rest; idle fractions of the async rows")
    stages = (*POOL_STAGES, *TRAINER_STAGES)
    print("| config | " + " | ".join(stages) + " | pool idle | trainer idle | staleness |")
    print("|---|" + "---:|" * (len(stages) + 3))
    for name, row in rows.items():

        def show(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        cells = [show(row[stage]) for stage in stages]
        extra = [show(row[key]) for key in ("async/rollout_idle_fraction", "async/trainer_idle_fraction")]
        extra.append(show(row["async/staleness_mean"]))
        print(f"| {name} | " + " | ".join(cells + extra) + " |")
    png = folder / "reward_vs_time.png"
    plot(runs, png, args.target)
    print(f"\nreward against wall-clock time: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
