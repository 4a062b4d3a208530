"""Time to the demo's reward: kuberl synchronous and asynchronous (spec.rollout.maxStaleness) against TRL's best.

    .venv/bin/python bench/async.py                  # 30 steps per configuration, 1 round (~10 min here)
    .venv/bin/python bench/async.py --steps 10       # a smoke run
    .venv/bin/python bench/async.py --repeats 3 --target 0.9
    .venv/bin/python bench/async.py --trl            # kuberl's rows only (no TRL installed)

The job: examples/tiny-grpo.yaml (tiny://counter, the counting task, GRPO, 8 prompts x 8 responses, at most 12
new tokens, lr 5e-4 after 5 warm-up steps), with algorithm.rolloutCorrection {importanceSampling: token} in every
kuberl configuration (the same algorithm in all of them: in the synchronous rows it corrects for the
engine-trainer gap only). Each configuration runs in a subprocess of its own, alternating in every round, all
with the demo's seed.

TRL runs the same job through bench/vs_trl.py's TRL child (`vs_trl.run_child`), with every adaptation listed
in that script's docstring: the tiny model built the same way (stopping at the same EOS), the demo's prompts and
its `tiny_task` reward, the demo's batch, group, micro-batch, learning rate with kuberl's warm-up, KL and clip;
vLLM colocate mode on vLLM's CPU build. By default in TRL's best configuration measured there (vLLM colocate,
bf16 autocast: `--trl vllm --trl-precision bf16`), on 1 and on 2 torch threads (`--trl-threads`, a row each),
its OpenMP threads waiting passively (TRL_ENV, below); `--trl hf vllm` adds TRL's own generation. The baseline
is the TRL row soonest to the target (the fastest per step if none reaches it). TRL draws its own prompt order
and samples from the same seed value, so its curve is not kuberl's replayed. TRL 1.16.0 is needed:
`.venv/bin/pip install trl==1.16.0 psutil`.

How the 2 cores are split (each configuration gets both, in total; Ray's workers at niceness 0, as TRL's):
  trl-*-2t         one process, torch on 2 threads: generation (vLLM in the same process), then the update
  trl-*-1t         the same on 1 thread, the other core left idle: TRL's choice, measured because on this
                   shared machine one thread is as fast for a model this small
  sync-colocated   2 actor ranks x 1 CPU (FSDP2 over gloo), the engine in the actor's ranks: the demo's layout
  sync-separate    1 actor rank x 1 CPU + 1 rollout replica x 1 CPU, maxStaleness 0: one side idles while
                   the other works (the synchronous loop)
  async-k1/k2      the same split, maxStaleness 1 / 2: the replica generates while the actor trains
`--kuberl-engine vllm` and `--kuberl-precision bf16` give kuberl's rows TRL's engine and training precision.

Printed per configuration: wall seconds to the target reward (from the first step's end to the end of the first
step whose 3-step mean reward reaches --target; a run that did not reach it within --steps has no time: "not
reached in N steps"), the steps that took, wall seconds per step (median interval between consecutive step
ends: everything a step costs), steps/s, generated tokens per wall second, each against the baseline (TRL's
best in this run: time to target as baseline / row, > 1 is faster; steps/s as row / baseline), the mean reward
of the first and last 3 steps and peak memory (summed RSS of the run's process tree, sampled every 2 s for
kuberl, 5 s for TRL). With --repeats, medians over the runs (a run that did not reach the target counts as the
slowest). Then the per-stage split (time/rollout and time/reward on the pool's side; time/reference ..
time/sync on the trainer's) and the idle fractions of the asynchronous rows. A PNG of reward against
wall-clock time for every configuration is written next to the runs' folder (reward_vs_time.png).
"""

import argparse
import copy
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import vs_trl
import yaml
from reward_target import first_step_reaching, median_reached

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "tiny-grpo.yaml"
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
CORES = {
    "trl": "1 process x {threads} thread(s)",
    "sync-colocated": "2 ranks x 1 CPU",
    "sync-separate": "1 rank + 1 replica x 1 CPU",
    "async-k1": "1 rank + 1 replica x 1 CPU",
    "async-k2": "1 rank + 1 replica x 1 CPU",
}
POOL_STAGES = ("rollout", "reward")
TRAINER_STAGES = ("reference", "old_logprobs", "correction", "advantages", "update", "sync")
#: TRL's OpenMP threads wait passively. With the default spin-wait, on this shared machine a descheduled thread
#: holds up every parallel region: TRL at 2 threads took a median 9.9 s a step on the demo at load 7-15, 0.53-0.67 s
#: with this (bench/README.md). kuberl's workers run 1 thread each, where there is nothing to wait for.
TRL_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
TRL_MISSING = (
    "bench/async.py: TRL's row needs trl 1.16.0, which is not installed: run\n"
    "    .venv/bin/pip install trl==1.16.0 psutil\n"
    "(or `.venv/bin/pip install -e '.[bench]'`), or pass --trl with no engine for kuberl's rows alone."
)


def job_manifest(name: str, steps: int, engine: str, precision: str) -> dict:
    """The demo RLJob with configuration `name`'s placement, the kuberl rows' engine and training precision."""
    manifest = yaml.safe_load(DEMO.read_text())
    manifest["metadata"]["name"] = f"async-bench-{name}"
    spec = manifest["spec"]
    spec["training"]["totalSteps"] = steps
    spec["training"]["computeDtype"] = "bfloat16" if precision == "bf16" else "float32"
    spec["data"]["train"] = str(REPO / "examples" / spec["data"]["train"])
    spec["rollout"]["engine"] = engine
    if engine == "vllm":
        spec["rollout"]["kvCacheBytes"] = vs_trl.Workload.kv_cache_bytes
    spec["algorithm"]["rolloutCorrection"] = {"importanceSampling": "token"}
    spec["checkpoint"] = {"intervalSteps": None, "saveOnPreemption": True, "exportHf": False}
    for section, values in CONFIGS[name].items():
        for key, value in values.items():
            spec.setdefault(section, {})[key] = copy.deepcopy(value)
    return manifest


def demo_workload(steps: int) -> vs_trl.Workload:
    """The demo job as vs_trl's Workload, which its TRL child runs; a demo setting that child does not mirror is
    refused, naming it, rather than measured as something else."""
    from kuberl.api import parse_rljob

    spec = parse_rljob(yaml.safe_load(DEMO.read_text())).spec
    algorithm, actor = spec.algorithm, spec.models.actor
    mirrored = {  # what vs_trl's TRL child sets, against the demo's value
        "models.actor.path (a tiny:// model)": actor.path.startswith("tiny://"),
        "data.train (examples/data/tiny-task.jsonl)": (DEMO.parent / spec.data.train).resolve() == vs_trl.DATA,
        "reward.function (tiny_task)": spec.reward.function == "tiny_task",
        "algorithm.name (grpo)": algorithm.name.value == "grpo",
        "algorithm.clipRatioLow/High (0.2)": algorithm.clip_ratio_low == algorithm.clip_ratio_high == 0.2,
        "algorithm.ppoEpochs (1)": algorithm.ppo_epochs == 1,
        "algorithm.kl (k3 in the loss)": (algorithm.kl.estimator.value, algorithm.kl.placement.value) == ("k3", "loss"),
        "rollout.temperature/topP (1)": spec.rollout.temperature == spec.rollout.top_p == 1.0,
        "models.actor.optim.schedule (constant)": actor.optim.schedule.value == "constant",
        "models.actor.optim.weightDecay (0)": actor.optim.weight_decay == 0.0,
        "models.actor.optim.gradClip (1)": actor.optim.grad_clip == 1.0,
    }
    unmirrored = [name for name, same in mirrored.items() if not same]
    if unmirrored:
        raise SystemExit(f"{DEMO} sets what TRL's row does not mirror: {', '.join(unmirrored)}; update demo_workload")
    return vs_trl.Workload(
        model=actor.path.removeprefix("tiny://"),
        prompts=spec.data.batch_size,
        group=algorithm.group_size,
        max_new_tokens=spec.rollout.max_new_tokens,
        micro_batch=spec.training.micro_batch_size,
        lr=actor.optim.lr,
        warmup_steps=actor.optim.warmup_steps,
        kl_coef=algorithm.kl.coef,
        steps=steps,
        seed=spec.training.seed,
        max_prompt_length=spec.data.max_prompt_length,
    )


@dataclass
class Run:
    name: str
    records: list[dict] = field(default_factory=list)  # one a step: metrics.jsonl's keys (TRL: the same names)
    ends: list[float] = field(default_factory=list)  # wall time each step ended (s)
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


def run_kuberl(name: str, steps: int, engine: str, precision: str, folder: Path) -> Run:
    """`kuberl run` of the demo in configuration `name`; a step ends when its line appears in metrics.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / f"{name}.yaml"
    job.write_text(yaml.safe_dump(job_manifest(name, steps, engine, precision)))
    output = folder / name
    metrics = output / "metrics.jsonl"
    kuberl = Path(sys.executable).parent / "kuberl"
    run = Run(name)
    started = time.monotonic()
    child = subprocess.Popen(
        [str(kuberl), "run", str(job), "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "RAY_worker_niceness": "0"},  # Ray's default, 15, yields the cores to TRL's 0
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


def trl_name(engine: str, precision: str, threads: int) -> str:
    return f"trl-{engine}-{precision}-{threads}t"


def run_trl(engine: str, precision: str, threads: int, steps: int, folder: Path) -> Run:
    """TRL's GRPOTrainer on the demo job, through vs_trl's TRL child and its adaptations, on `threads` torch threads."""
    folder.mkdir(parents=True, exist_ok=True)
    config = vs_trl.Config("trl", engine, ranks=1, cpus=float(threads), precision=precision)
    started = time.monotonic()
    result = vs_trl.run_child(demo_workload(steps), config, folder, env=TRL_ENV)
    name = trl_name(engine, precision, threads)
    if result.error:
        raise SystemExit(f"{name} failed: {result.error}")
    run = Run(name, peak_rss=result.peak_rss, seconds=time.monotonic() - started)
    for step in result.steps:
        run.ends.append(step["end"])
        run.records.append(
            {
                "reward/mean": step["reward"],
                "rollout/tokens": step["tokens"],
                "time/rollout": step["generate"],
                "time/sync": step["sync"],
                "time/update": step["update"],
                "trl/score": step["score"],  # reward, reference forward and advantages (TRL's _prepare_inputs)
            }
        )
    return run


def progress(round_index: int, run: Run, target: float) -> str:
    """One run's line: its length and when it reached the target (the table gives medians; this, the spread)."""
    reached = first_step_reaching([r["reward/mean"] for r in run.records], target)
    to_target = "not reached" if reached is None else f"{run.ends[reached] - run.ends[0]:.1f} s ({reached + 1} steps)"
    return (
        f"round {round_index + 1} {run.name}: {run.seconds:.0f} s, to target {to_target}, load {os.getloadavg()[0]:.1f}"
    )


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(runs: list[Run], target: float) -> dict[str, Any]:
    walls = [b - a for run in runs for a, b in zip(run.ends, run.ends[1:], strict=False)]
    tokens = [r["rollout/tokens"] for run in runs for r in run.records[1:]]
    wall = statistics.median(walls)
    reached = [first_step_reaching([r["reward/mean"] for r in run.records], target) for run in runs]
    row: dict[str, Any] = {
        "wall_s": wall,
        "steps_per_s": 1.0 / wall,
        "tokens_per_s": statistics.median(tokens) / wall,
        "peak_gib": max(run.peak_rss for run in runs) / 2**30,
        "reward_start": statistics.fmean(statistics.fmean(r["reward/mean"] for r in run.records[:3]) for run in runs),
        "reward_end": statistics.fmean(statistics.fmean(r["reward/mean"] for r in run.records[-3:]) for run in runs),
        "runs": len(runs),
        "reached": sum(i is not None for i in reached),
        "to_target_s": median_reached(
            [None if i is None else run.ends[i] - run.ends[0] for run, i in zip(runs, reached, strict=True)]
        ),
        "to_target_steps": median_reached([None if i is None else i + 1 for i in reached]),
    }
    for key in (*(f"time/{stage}" for stage in (*POOL_STAGES, *TRAINER_STAGES)), "trl/score"):
        row[key] = median([r[key] for run in runs for r in run.records[1:] if key in r])
    for key in ("async/rollout_idle_fraction", "async/trainer_idle_fraction", "async/staleness_mean"):
        row[key] = median([r[key] for run in runs for r in run.records[1:] if key in r])
    return row


def baseline(rows: dict[str, dict[str, Any]]) -> str:
    """TRL's best row: the soonest to the target, else (none reached it) the fastest per step; no TRL: the first."""
    trl = [name for name in rows if name.startswith("trl-")]
    if not trl:
        return next(iter(rows))
    reached = [name for name in trl if rows[name]["to_target_s"] is not None]
    if reached:
        return min(reached, key=lambda name: rows[name]["to_target_s"])
    return min(trl, key=lambda name: rows[name]["wall_s"])


def print_tables(rows: dict[str, dict[str, Any]], steps: int, target: float) -> None:
    base_name = baseline(rows)
    base = rows[base_name]
    print(f"\n{steps} steps a run; target: a 3-step mean reward of {target}; baseline (1.00x): {base_name}")
    print(
        "| config | cores | to target s | steps | reached | vs base | s/step | steps/s | vs base | tok/s | "
        "reward first 3 | last 3 | peak GiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        if row["to_target_s"] is None:
            to_target = f"not reached in {steps} steps | -"
        else:
            to_target = f"{row['to_target_s']:.1f} | {row['to_target_steps']:g}"
        speedup = "-"
        if row["to_target_s"] is not None and base["to_target_s"] is not None:
            speedup = f"{base['to_target_s'] / row['to_target_s']:.2f}x"
        cores = (
            CORES["trl"].format(threads=name.split("-")[-1].removesuffix("t"))
            if name.startswith("trl-")
            else CORES[name]
        )
        print(
            f"| {name} | {cores} | {to_target} | {row['reached']}/{row['runs']} | {speedup} | {row['wall_s']:.2f} | "
            f"{row['steps_per_s']:.2f} | {row['steps_per_s'] / base['steps_per_s']:.2f}x | {row['tokens_per_s']:.0f} | "
            f"{row['reward_start']:.3f} | {row['reward_end']:.3f} | {row['peak_gib']:.1f} |"
        )

    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    print("\nper-stage medians (s); pool: rollout, reward; trainer: the rest; idle fractions of the async rows")
    stages = (*POOL_STAGES, *TRAINER_STAGES)
    print("| config | " + " | ".join(stages) + " | pool idle | trainer idle | staleness |")
    print("|---|" + "---:|" * (len(stages) + 3))
    for name, row in rows.items():
        keys = [f"time/{stage}" for stage in stages]
        keys += ["async/rollout_idle_fraction", "async/trainer_idle_fraction", "async/staleness_mean"]
        print(f"| {name} | " + " | ".join(show(row[key]) for key in keys) + " |")
    for name, row in rows.items():
        if row["trl/score"] is not None:
            print(f"{name}: reward + reference forward + advantages (TRL's score, not split) {show(row['trl/score'])}")


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
    parser.add_argument("--steps", type=int, default=30, help="the step budget of every run")
    parser.add_argument("--repeats", "--rounds", type=int, default=1, help="rounds over all configurations")
    parser.add_argument("--target", type=float, default=0.85, help="the mean reward (over 3 steps) to reach")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS), help="kuberl's rows")
    parser.add_argument(
        "--trl", nargs="*", default=["vllm"], choices=("hf", "vllm"), help="TRL's generation engines; none: no TRL row"
    )
    parser.add_argument("--trl-precision", choices=("fp32", "bf16"), default="bf16", help="TRL's training precision")
    parser.add_argument(
        "--trl-threads", nargs="+", type=int, default=[1, 2], choices=(1, 2), help="TRL's torch threads, a row each"
    )
    parser.add_argument("--kuberl-engine", choices=("hf", "vllm"), default="hf", help="kuberl's rollout engine")
    parser.add_argument("--kuberl-precision", choices=("fp32", "bf16"), default="fp32", help="training.computeDtype")
    args = parser.parse_args()
    if args.trl and importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING)
    folder = Path(tempfile.mkdtemp(prefix="kuberl-async-bench-"))
    trl_rows = [(engine, threads) for engine in args.trl for threads in args.trl_threads]
    order = [trl_name(engine, args.trl_precision, threads) for engine, threads in trl_rows] + args.configs
    runs: dict[str, list[Run]] = {name: [] for name in order}
    print(f"runs in {folder}; load average at start {os.getloadavg()}", flush=True)
    for round_index in range(args.repeats):
        round_folder = folder / f"round{round_index}"
        for engine, threads in trl_rows:
            run = run_trl(engine, args.trl_precision, threads, args.steps, round_folder)
            runs[run.name].append(run)
            print(progress(round_index, run, args.target), flush=True)
        for name in args.configs:
            run = run_kuberl(name, args.steps, args.kuberl_engine, args.kuberl_precision, round_folder)
            runs[name].append(run)
            print(progress(round_index, run, args.target), flush=True)
    print(f"kuberl rows: {args.kuberl_engine} engine, {args.kuberl_precision} training; load at end {os.getloadavg()}")
    print_tables({name: summarise(repeats, args.target) for name, repeats in runs.items()}, args.steps, args.target)
    png = folder / "reward_vs_time.png"
    plot(runs, png, args.target)
    print(f"\nreward against wall-clock time: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
