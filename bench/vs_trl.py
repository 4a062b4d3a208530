"""kuberl against TRL's GRPOTrainer: the same GRPO job, run by each, alternating, on this machine.

    .venv/bin/python bench/vs_trl.py                       # 6 steps, 2 rounds (needs `pip install -e '.[bench]'`)
    .venv/bin/python bench/vs_trl.py --quick               # 2 steps, 1 round: a smoke test
    .venv/bin/python bench/vs_trl.py --kuberl-engines hf --trl-modes hf --repeats 1
    .venv/bin/python bench/vs_trl.py --kuberl-engines hf --trl-modes hf --staleness 0 1 2   # + asynchronous rows

The job (identical for both): the tiny://small model (~25M-parameter Llama, random weights, built
locally by `kuberl.runtime.models.tiny`), prompts from examples/data/tiny-task.jsonl, reward
`tiny_task`, B=4 prompts x G=4 completions = 16 completions of at most 64 new tokens per step,
one optimiser step per batch in micro-batches of 8, GRPO advantages normalised by the group std,
PPO clip 0.2, one PPO epoch, k3 KL in the loss with coefficient 0.001, seq-mean-token-mean loss,
temperature 1, top-p 1, fp32, no gradient checkpointing, AdamW with a constant learning rate and
gradient clipping at 1.0.

Configurations, alternating in every round (each in a subprocess of its own):
  kuberl   hf / vllm rollout engine, 1 actor rank x `--threads` CPUs (a single trainer, like TRL)
  TRL      Hugging Face `generate` (its default) and vLLM colocate mode (vLLM's CPU build)
  kuberl   hf engine, 2 actor ranks x 1 CPU (FSDP2 over gloo): an extra row

For each it prints medians over all steps but the first (warm-up) of all rounds: the wall time
per step (the interval between consecutive step ends, so everything a step costs is counted), generation time,
generated tokens/s (end to end and during generation), CPU seconds per step (user + system of
the whole process tree: a figure that depends less on what else runs on a shared machine), peak
memory, and the mean reward of the first and last step (a sanity check that both learn; with a
handful of steps it says little). Then the ratio of each kuberl row to the best TRL row.

Peak memory: the parent samples the child's whole process tree every 5 s (for kuberl that is
the driver plus Ray's GCS, raylet, dashboard and every worker, all descendants of the driver)
and records the largest sum of PSS (proportional set size: shared pages such as the torch
libraries are split between the processes that map them, so the sum is not inflated by them)
and of RSS. Sampling can miss a short peak; it is sparse because reading every process's smaps costs
CPU: at 0.5 s the sampler took ~9% of a core and slowed the measured runs, kuberl's (more processes)
most.

Adaptations (every departure from plain `GRPOTrainer(...).train()`), in `run_trl_child`,
`trl_model_folder` and `adapt_trl_vllm_to_cpu`:
1. Training precision per row: fp32 (`bf16=False`; kuberl `training.computeDtype: float32`) or bf16
   autocast with fp32 weights and optimiser (TRL's default `bf16=True`; kuberl `computeDtype:
   bfloat16`). Generation stays fp32 in both (see 4a). `gradient_checkpointing=False` (TRL's
   default is on; off in both), `use_cpu=True`.
2. kuberl's learning-rate schedule: constant after `warmup_steps` of lr x (step + 1) / (warmup + 1)
   (`kuberl_warmup`; Trainer's default decays linearly to 0, and its constant_with_warmup starts the
   first step at lr 0), `use_bias_correction_kl=False` (TRL 1.x multiplies k3 by the importance ratio by
   default; kuberl uses plain k3), `loss_type="grpo"` (= kuberl's seq_mean_token_mean), `beta` =
   kuberl's kl.coef, `scale_rewards="group"` (= normalizeAdvantageStd), `epsilon=0.2`,
   `num_iterations=1`, `vllm_importance_sampling_correction=False` (kuberl's
   rollout.useEngineLogprobs is false: the behaviour policy is the trainer's own forward pass).
   kuberl's dual clip is switched off (`dualClipC: null`), which TRL does not have; with one
   update per batch the ratio is 1 and no clip acts anyway.
3. Both stop a completion only at the tokenizer's EOS (`<|endoftext|>`): kuberl's controller
   passes that id alone; the tiny model's generation_config.json also lists `<|im_end|>`, so
   TRL's copy of the model gets `eos_token_id = <|endoftext|>` there (TRL and vLLM read it).
4. vLLM colocate mode on vLLM's CPU backend:
   a. TRL's `LLM(...)` call is wrapped: `gpu_memory_utilization` is dropped (on CPU it reserves a
      share of RAM), and `dtype="float32"` (the CPU backend downcasts to bf16 by default),
      `enforce_eager=True` and `kv_cache_memory_bytes` (= kuberl's rollout.kvCacheBytes) are set.
   b. vLLM's CPU worker replaces `torch.set_num_threads` with a no-op and binds its own threads;
      TRL trains in the same process, so the wrapper restores it and the `--threads` setting
      (kuberl's vLLM engine does the same).
   c. Weight sync: TRL's colocate sync calls `model.load_weights` on vLLM's model, which crashes
      on the CPU backend at the first sync (`'Parameter' object has no attribute
      'weight_loader'`: the backend repacks linear weights for its GEMM kernels). The benchmark
      syncs through `llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`, the
      same parameter iterator TRL uses, then repacks the LM head tied to the embedding (on CPU it
      keeps its own packed copy, which reload does not refresh) and resets the prefix cache.
   d. vLLM's sampler ranks each returned log-prob with a `torch.compile`d helper that torch 2.13's
      inductor fails to build on this machine; it is replaced by the same expression run eagerly.
   b-d are what kuberl's own vLLM engine (runtime/engines/vllm.py) does.
5. kuberl's Ray workers run at niceness 0 (`RAY_worker_niceness=0`); Ray's default is 15, which
   on a shared machine hands the CPU to every other process first while TRL runs at 0.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data" / "tiny-task.jsonl"
#: kuberl's stages between generation and the update (TRL does the same inside `_prepare_inputs`).
SCORE_STAGES = ("reward", "reference", "old_logprobs", "critic", "advantages")


@dataclass(frozen=True)
class Workload:
    """What both frameworks run; every field maps to one setting of each (see the module docstring)."""

    model: str = "small"
    prompts: int = 4  # B: prompts per step (data.batchSize)
    group: int = 4  # G: completions per prompt (groupSize / num_generations)
    max_new_tokens: int = 64
    micro_batch: int = 8  # sequences per forward/backward (training.microBatchSize / per_device_train_batch_size)
    lr: float = 3e-3  # the rate the demo used before it started from a pretrained model (speed, not learning)
    warmup_steps: int = 0  # kuberl's optim.warmupSteps, and the same warm-up in TRL (adaptation 2)
    kl_coef: float = 0.001  # the grpo preset's (TRL: beta)
    steps: int = 6
    seed: int = 0
    max_prompt_length: int = 32
    kv_cache_bytes: int = 256 << 20  # vLLM's KV cache on CPU, both frameworks
    device: str = "cpu"  # cuda: one GPU for both (bench/gpu/run.sh); the CPU adaptations (4) are then off
    gpu_memory_utilization: float = 0.3  # vLLM's share of the GPU on cuda, both frameworks

    @property
    def model_location(self) -> str:
        """`model` is a tiny model's name or a model folder (bench/gpu builds Qwen2.5 shapes)."""
        return self.model if "/" in self.model else f"tiny://{self.model}"


@dataclass(frozen=True)
class Config:
    """One row of the table: a framework, its generation engine and its processes."""

    framework: str  # kuberl | trl
    engine: str  # hf | vllm
    ranks: int = 1  # kuberl actor ranks (TRL: always one process)
    cpus: float = 2.0  # CPUs per rank = torch threads per rank
    precision: str = "fp32"  # training compute: fp32, or bf16 autocast with fp32 weights (both frameworks)
    staleness: int | None = None  # kuberl: a separate rollout replica of `cpus` CPUs beside the actor's ranks,
    #                               with rollout.maxStaleness this (None: the engine colocated in the actor)

    @property
    def label(self) -> str:
        if self.framework == "trl":
            return f"TRL {self.engine} {self.precision}"
        if self.staleness is not None:
            return f"kuberl {self.engine} {self.ranks}+1x{self.cpus:g}cpu k={self.staleness} {self.precision}"
        return f"kuberl {self.engine} {self.ranks}x{self.cpus:g}cpu {self.precision}"


@dataclass
class ChildResult:
    config: Config
    steps: list[dict[str, float]] = field(default_factory=list)  # per step: wall_end, cpu, gen, tokens, reward...
    setup_seconds: float = 0.0
    peak_pss: float = 0.0  # bytes, summed over the process tree
    peak_rss: float = 0.0
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # threads and CPU affinity the trainer ended up with


# -- the kuberl child --------------------------------------------------------------------------------
def kuberl_manifest(work: Workload, config: Config) -> dict[str, Any]:
    """The RLJob for the workload: every algorithm knob spelled out, not left to a preset."""
    rollout: dict[str, Any] = {
        "engine": config.engine,
        "maxNewTokens": work.max_new_tokens,
        "temperature": 1.0,
        "topP": 1.0,
        "useEngineLogprobs": False,
    }
    if config.engine == "vllm" and work.device == "cpu":
        rollout["kvCacheBytes"] = work.kv_cache_bytes
    if config.engine == "vllm" and work.device == "cuda":
        rollout["gpuMemoryUtilization"] = work.gpu_memory_utilization
    algorithm_extra: dict[str, Any] = {}
    resources: dict[str, Any] = {
        "actor": {"replicas": config.ranks, "cpus": config.cpus, "gpus": 1 if work.device == "cuda" else 0}
    }
    if config.staleness is not None:  # asynchronous rows: the rollout on a replica of its own
        rollout.update(placement="separate", maxStaleness=config.staleness)
        resources["rollout"] = {"replicas": 1, "cpus": config.cpus, "gpus": 1 if work.device == "cuda" else 0}
        # the reference on a pool of its own: the producer runs its forward after each generation, on the
        # rollout's side, while the trainer updates (AsyncController.generate); the two take turns, so the
        # run still has the trainer's and the rollout's CPUs busy at most
        resources["reference"] = {"replicas": 1, "cpus": config.cpus, "gpus": 1 if work.device == "cuda" else 0}
        # the rules ask for an off-policy correction with k >= 1: decoupled PPO's truncated weight, computed
        # in the update from its own forward (one PPO epoch over one mini-batch: no old-log-prob pass)
        algorithm_extra["rolloutCorrection"] = {"importanceSampling": "token"}
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "vs-trl"},
        "spec": {
            "algorithm": {
                "name": "grpo",
                "groupSize": work.group,
                "advantageEstimator": "grpo",
                "normalizeAdvantageStd": True,
                "clipRatioLow": 0.2,
                "clipRatioHigh": 0.2,
                "dualClipC": None,
                "lossAggregation": "seq_mean_token_mean",
                "ppoEpochs": 1,
                "kl": {"coef": work.kl_coef, "estimator": "k3", "placement": "loss"},
                **algorithm_extra,
            },
            "models": {
                "actor": {
                    "path": work.model_location,
                    "dtype": "float32",
                    "gradientCheckpointing": False,
                    "optim": {
                        "lr": work.lr,
                        "warmupSteps": work.warmup_steps,
                        "weightDecay": 0.0,
                        "schedule": "constant",
                        "gradClip": 1.0,
                    },
                }
            },
            "reward": {"function": "tiny_task"},
            "data": {"train": str(DATA), "batchSize": work.prompts, "maxPromptLength": work.max_prompt_length},
            "rollout": rollout,
            "training": {
                "totalSteps": work.steps,
                "seed": work.seed,
                "microBatchSize": work.micro_batch,
                "computeDtype": "bfloat16" if config.precision == "bf16" else "float32",
            },
            "resources": resources,
            "checkpoint": {"intervalSteps": None, "resume": False, "exportHf": False, "saveOnPreemption": True},
        },
    }


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its live descendants."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def run_kuberl_child(work: Workload, config: Config) -> ChildResult:
    os.environ["RAY_worker_niceness"] = "0"  # adaptation 5
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from kuberl.api import parse_rljob
    from kuberl.runtime.driver import run_job
    from kuberl.runtime.loop import controller as controller_module
    from kuberl.runtime.loop.async_controller import AsyncController

    ends: list[tuple[float, float, float]] = []  # (start, end, tree CPU seconds at the end) per step
    inner_step = controller_module.Controller.step
    inner_train = AsyncController.train

    def timed_step(self: Any, step: int) -> Any:
        started = time.perf_counter()
        result = inner_step(self, step)
        ends.append((started, time.perf_counter(), tree_cpu_seconds()))
        return result

    def timed_train(self: Any, generated: Any) -> Any:  # the asynchronous rows: a step ends when its update does
        started = time.perf_counter()
        result = inner_train(self, generated)
        ends.append((started, time.perf_counter(), tree_cpu_seconds()))
        return result

    controller_module.Controller.step = timed_step
    AsyncController.train = timed_train
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs-trl-kuberl-") as out:
        run = run_job(parse_rljob(kuberl_manifest(work, config)), Path(out), REPO / "examples", progress=False)
    result = ChildResult(config, setup_seconds=ends[0][0] - started if ends else 0.0)
    for (step_start, end, cpu), record in zip(ends, run.history, strict=True):
        result.steps.append(
            {
                "start": step_start,
                "end": end,
                "cpu": cpu,
                "generate": record["time/rollout"],
                "sync": record.get("time/sync", 0.0),
                "score": sum(record.get(f"time/{stage}", 0.0) for stage in SCORE_STAGES),
                "update": record["time/update"],
                "tokens": record["rollout/tokens"],
                "reward": record["reward/mean"],
                **{f"stage/{key[5:]}": value for key, value in record.items() if key.startswith("time/")},
            }
        )
    return result


# -- the TRL child -----------------------------------------------------------------------------------
def _count_at_least(x: Any, values: Any) -> Any:
    """Per row of x (B, V), how many entries are >= values (B, 1): vLLM's log-prob rank, eagerly."""
    return (x >= values).sum(-1)  # (B,)


def _repack_tied_weights(worker: Any) -> int:
    """Inside vLLM's worker: repack every module whose weight another module loaded first (the tied LM head)."""
    model = getattr(worker, "worker", worker).model_runner.get_model()
    seen: set[int] = set()
    repacked = 0
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None or weight.numel() == 0:
            continue
        if id(weight) not in seen:
            seen.add(id(weight))
            continue
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
            repacked += 1
    return repacked


def adapt_trl_vllm_to_cpu(kv_cache_bytes: int, threads: int) -> None:
    """Adaptations 4a-4d (module docstring): TRL's colocate mode on vLLM's CPU backend."""
    import torch
    from trl.generation import vllm_generation
    from vllm.v1.sample import sampler

    sampler.batched_count_greater_than = _count_at_least  # type: ignore[attr-defined]  # 4d
    real_llm = vllm_generation.LLM  # type: ignore[attr-defined]

    def cpu_llm(*args: Any, **kwargs: Any) -> Any:  # 4a, 4b
        kwargs.pop("gpu_memory_utilization", None)
        kwargs.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=kv_cache_bytes)
        set_threads = torch.set_num_threads
        try:
            return real_llm(*args, **kwargs)
        finally:
            torch.set_num_threads = set_threads
            set_threads(threads)

    def sync_weights(self: Any) -> None:  # 4c
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._iter_named_params()})
        self.llm.collective_rpc(_repack_tied_weights)
        self.llm.reset_prefix_cache()

    vllm_generation.LLM = cpu_llm  # type: ignore[attr-defined,assignment]
    vllm_generation.VLLMGeneration.sync_weights = sync_weights  # type: ignore[method-assign]


def trl_model_folder(work: Workload, directory: Path) -> Path:
    """The same tiny model kuberl builds for tiny://NAME, stopping at the tokenizer's EOS only (adaptation 3)."""
    from kuberl.runtime.models.tiny import EOS_TOKEN, build_tiny_model

    if "/" in work.model:  # a model folder (its tokenizer is the tiny one: bench/gpu/models.py)
        shutil.copytree(work.model, directory)
    else:
        build_tiny_model(work.model, directory)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    eos_id = next(token["id"] for token in tokenizer["added_tokens"] if token["content"] == EOS_TOKEN)
    generation = directory / "generation_config.json"
    settings = json.loads(generation.read_text())
    settings["eos_token_id"] = eos_id
    generation.write_text(json.dumps(settings, indent=2) + "\n")
    return directory


def kuberl_warmup(warmup_steps: int) -> Any:
    """kuberl's constant schedule as a LambdaLR factor (runtime/engines/fsdp.py): a linear warm-up from above 0."""

    def factor(step: int) -> float:
        return (step + 1) / (warmup_steps + 1) if step < warmup_steps else 1.0

    return factor


def tiny_task_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float | None]:
    """kuberl's built-in `tiny_task` reward in TRL's calling convention (the dataset's answer column)."""
    from kuberl.runtime.rewards.builtin import tiny_task

    return [float(tiny_task(text, {"answer": want})[0]) for text, want in zip(completions, answer, strict=True)]


def run_trl_child(work: Workload, config: Config) -> ChildResult:
    import torch

    threads = max(1, int(config.cpus))
    torch.set_num_threads(threads)
    if config.engine == "vllm":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if work.device == "cpu":
            adapt_trl_vllm_to_cpu(work.kv_cache_bytes, threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]
    from trl.extras import profiling

    class KuberlScheduleGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer with kuberl's learning-rate schedule (adaptation 2)."""

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer or self.optimizer, kuberl_warmup(work.warmup_steps)
                )
            return self.lr_scheduler

    timings: dict[str, float] = {}
    real_log = profiling.ProfilingContext._log_metrics

    def record(self: Any, duration: float) -> None:  # TRL's own profiling blocks, kept per step
        timings[self.name] = timings.get(self.name, 0.0) + duration
        real_log(self, duration)

    profiling.ProfilingContext._log_metrics = record  # type: ignore[method-assign]

    steps: list[dict[str, float]] = []
    marks: dict[str, float] = {}

    class StepClock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["start"] = time.perf_counter()
            timings.clear()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            def timed(name: str) -> float:  # TRL names its blocks after the trainer's class (ours subclasses it)
                return sum(seconds for block, seconds in timings.items() if block.endswith(name))

            steps.append(
                {
                    "start": marks["start"],
                    "end": time.perf_counter(),
                    "cpu": tree_cpu_seconds(),
                    "generate": timed("generate"),
                    "sync": timed(".sync_weights"),
                    "prepare": timed("._prepare_inputs"),
                    **{f"stage/{key}": value for key, value in timings.items()},
                }
            )

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs-trl-trl-") as out:
        model_dir = trl_model_folder(work, Path(out) / "model")
        rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
        dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
        completions = work.prompts * work.group
        args = GRPOConfig(
            output_dir=str(Path(out) / "run"),
            max_steps=work.steps,
            seed=work.seed,
            learning_rate=work.lr,
            weight_decay=0.0,
            max_grad_norm=1.0,
            per_device_train_batch_size=work.micro_batch,
            gradient_accumulation_steps=completions // work.micro_batch,
            num_generations=work.group,
            max_completion_length=work.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            beta=work.kl_coef,
            use_bias_correction_kl=False,
            loss_type="grpo",
            scale_rewards="group",
            epsilon=0.2,
            num_iterations=1,
            use_vllm=config.engine == "vllm",
            vllm_mode="colocate",
            vllm_importance_sampling_correction=False,
            vllm_max_model_length=work.max_prompt_length + work.max_new_tokens + 1,
            bf16=config.precision == "bf16",
            gradient_checkpointing=False,
            use_cpu=work.device == "cpu",
            **({"vllm_gpu_memory_utilization": work.gpu_memory_utilization} if work.device == "cuda" else {}),
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = KuberlScheduleGRPOTrainer(
            model=str(model_dir),
            reward_funcs=tiny_task_reward,
            args=args,
            train_dataset=dataset,
            callbacks=[StepClock()],
        )
        assert args.generation_batch_size == completions, args.generation_batch_size
        info = {"torch_threads": torch.get_num_threads(), "cpu_affinity": len(os.sched_getaffinity(0))}
        # profiling_decorator on _prepare_inputs covers generation, rewards, reference log-probs, advantages
        trainer.train()
    logs = {int(entry["step"]): entry for entry in trainer.state.log_history if "reward" in entry}
    result = ChildResult(config, setup_seconds=steps[0]["start"] - started if steps else 0.0, info=info)
    for index, step in enumerate(steps, start=1):
        entry = logs[index]
        step["tokens"] = float(entry["completions/mean_length"]) * completions
        step["reward"] = float(entry["reward"])
        step["update"] = step["end"] - step["start"] - step["prepare"]
        step["score"] = step["prepare"] - step["generate"] - step["sync"]
        result.steps.append(step)
    return result


def child_main(work: Workload, config: Config, out: Path) -> int:
    try:
        result = run_kuberl_child(work, config) if config.framework == "kuberl" else run_trl_child(work, config)
    except Exception as error:  # noqa: BLE001 - reported in the table, the other rows still run
        import traceback

        traceback.print_exc()
        result = ChildResult(config, error=f"{type(error).__name__}: {error}")
    out.write_text(json.dumps(asdict(result)))
    return 0


# -- the parent: alternate children, sample their memory, print the table ------------------------------
class TreeMemory:
    """Samples a process and its descendants every `interval` s; keeps the largest PSS and RSS sums."""

    def __init__(self, pid: int, interval: float = 5.0) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_pss = 0.0
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        pss = rss = 0.0
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                info = proc.memory_full_info()
                pss += info.pss
                rss += info.rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def run_child(work: Workload, config: Config, log_dir: Path, env: dict[str, str] | None = None) -> ChildResult:
    """Runs one configuration in a child process (with `env` added to this process's environment)."""
    out = log_dir / f"{config.label.replace(' ', '_')}-{time.monotonic_ns()}.json"
    log = out.with_suffix(".log")
    command = [
        sys.executable,
        __file__,
        "--child",
        json.dumps({"work": asdict(work), "config": asdict(config)}),
        "--child-out",
        str(out),
    ]
    with log.open("w") as sink:
        child = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})}
        )
        with TreeMemory(child.pid) as memory:
            code = child.wait()
    if not out.exists():
        return ChildResult(config, error=f"exited {code} without a result; see {log}")
    result = load_result(out)
    result.peak_pss, result.peak_rss = memory.peak_pss, memory.peak_rss
    out.write_text(json.dumps(asdict(result)))  # with the peaks: `--report` rebuilds the table from these files
    if result.error:
        result.error += f" (log: {log})"
    return result


def load_result(path: Path) -> ChildResult:
    data = json.loads(path.read_text())
    return ChildResult(
        Config(**data["config"]),
        data["steps"],
        data["setup_seconds"],
        data.get("peak_pss", 0.0),
        data.get("peak_rss", 0.0),
        data["error"],
        data.get("info", {}),
    )


def report(log_dir: Path, work: Workload) -> None:
    """The table of every run whose result file is in `log_dir`, in the order they finished."""
    rows: dict[Config, Row] = {}
    for path in sorted(log_dir.glob("*.json"), key=lambda p: p.stat().st_mtime):
        result = load_result(path)
        rows.setdefault(result.config, Row(result.config)).add(result)
    print_table(list(rows.values()), work)


@dataclass
class Row:
    """A configuration's figures over all its rounds, first step of each run left out."""

    config: Config
    step: list[float] = field(default_factory=list)  # wall seconds per measured step
    generate: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)  # reward, reference and old log-probs, advantages
    update: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    peak_pss: float = 0.0
    peak_rss: float = 0.0
    rewards: list[tuple[float, float]] = field(default_factory=list)  # (first step, last step) per run
    errors: list[str] = field(default_factory=list)

    def add(self, result: ChildResult) -> None:
        if result.error or len(result.steps) < 2:
            self.errors.append(result.error or "fewer than 2 steps")
            return
        steps = result.steps
        for before, now in zip(steps, steps[1:], strict=False):
            self.step.append(now["end"] - before["end"])
            self.cpu.append(now["cpu"] - before["cpu"])
            self.generate.append(now["generate"])
            self.sync.append(now["sync"])
            self.score.append(now.get("score", 0.0))
            self.update.append(now["update"])
            self.tokens.append(now["tokens"])
        self.peak_pss, self.peak_rss = max(self.peak_pss, result.peak_pss), max(self.peak_rss, result.peak_rss)
        self.rewards.append((steps[0]["reward"], steps[-1]["reward"]))

    @property
    def ok(self) -> bool:
        return bool(self.step)

    @property
    def step_median(self) -> float:
        return statistics.median(self.step)

    @property
    def tokens_per_second(self) -> float:
        """Median over measured steps of that step's generated tokens / its wall time."""
        return statistics.median(tokens / step for tokens, step in zip(self.tokens, self.step, strict=True))

    @property
    def generated_per_second(self) -> float:
        """Median over measured steps of generated tokens / generation time."""
        return statistics.median(t / max(g, 1e-9) for t, g in zip(self.tokens, self.generate, strict=True))


def print_table(rows: list[Row], work: Workload) -> None:
    """Medians over the measured steps of all rounds: a neighbour's burst on a shared machine moves them least."""
    gib = 1 << 30
    median = statistics.median
    print(
        f"\nGRPO on tiny://{work.model}: {work.prompts} prompts x {work.group} completions, "
        f"<= {work.max_new_tokens} new tokens, micro-batch {work.micro_batch}; steps 2..{work.steps} of each run, "
        "medians over all rounds"
    )
    print(
        f"{'configuration':<28}{'step s (min-max)':>20}{'gen s':>7}{'sync s':>7}{'score s':>8}{'update s':>9}"
        f"{'tok/step':>9}{'tok/s':>6}{'gen tok/s':>10}{'CPU s/step':>11}{'PSS GiB':>8}{'RSS GiB':>8}"
        "  reward first->last"
    )
    for row in rows:
        if not row.ok:
            print(f"{row.config.label:<28}  failed: {'; '.join(row.errors)}")
            continue
        steps = f"{row.step_median:.2f} ({min(row.step):.2f}-{max(row.step):.2f})"
        rewards = ", ".join(sorted({f"{a:.3f}->{b:.3f}" for a, b in row.rewards}))
        print(
            f"{row.config.label:<28}{steps:>20}{median(row.generate):7.2f}{median(row.sync):7.2f}"
            f"{median(row.score):8.2f}{median(row.update):9.2f}{median(row.tokens):9.0f}"
            f"{row.tokens_per_second:6.0f}{row.generated_per_second:10.0f}{median(row.cpu):11.2f}"
            f"{row.peak_pss / gib:8.2f}{row.peak_rss / gib:8.2f}  {rewards}"
        )
    trl = [row for row in rows if row.config.framework == "trl" and row.ok]
    kuberl = [row for row in rows if row.config.framework == "kuberl" and row.ok]
    if not trl or not kuberl:
        return
    best = min(trl, key=lambda row: row.step_median)
    print(f"\nkuberl / best TRL ({best.config.label}), medians: >1 means kuberl is slower or uses more")
    for row in kuberl:
        print(
            f"{row.config.label:<28}step time x{row.step_median / best.step_median:.2f}   "
            f"tokens/s x{row.tokens_per_second / best.tokens_per_second:.2f}   "
            f"CPU s/step x{median(row.cpu) / median(best.cpu):.2f}   "
            f"peak PSS x{row.peak_pss / max(best.peak_pss, 1.0):.2f}"
        )
    print("\nbest of each, per training precision: TRL step time / kuberl step time (>1: kuberl is faster)")
    for precision in sorted({row.config.precision for row in kuberl} & {row.config.precision for row in trl}):
        fastest_k = min((r for r in kuberl if r.config.precision == precision), key=lambda r: r.step_median)
        fastest_t = min((r for r in trl if r.config.precision == precision), key=lambda r: r.step_median)
        speedup = fastest_t.step_median / fastest_k.step_median
        print(
            f"{precision}: {fastest_t.config.label} {fastest_t.step_median:.2f} s / "
            f"{fastest_k.config.label} {fastest_k.step_median:.2f} s = x{speedup:.2f}"
        )


def configurations(args: argparse.Namespace) -> list[Config]:
    """One round, alternating kuberl and TRL: k1 TRL-hf k2 TRL-vllm ... per precision, then the 2-rank row."""
    threads = float(args.threads)
    order: list[Config] = []
    for precision in args.precisions:
        kuberl = [Config("kuberl", engine, 1, threads, precision) for engine in args.kuberl_engines]
        trl = [Config("trl", engine, 1, threads, precision) for engine in args.trl_modes]
        for index in range(max(len(kuberl), len(trl))):
            order += kuberl[index : index + 1] + trl[index : index + 1]
    if args.two_ranks and args.kuberl_engines:
        order.append(Config("kuberl", args.kuberl_engines[0], 2, threads / 2, args.precisions[0]))
    for staleness in args.staleness:  # 1 actor rank and 1 rollout replica, half the CPUs each
        order.append(Config("kuberl", args.kuberl_engines[0], 1, threads / 2, args.precisions[0], staleness))
    return order


def precisions(text: str) -> list[str]:
    """A comma-separated list of training precisions (fp32, bf16)."""
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {"fp32", "bf16"})
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown precision(s) {', '.join(unknown)}; use fp32 and/or bf16")
    return chosen


def names(text: str) -> list[str]:
    """A comma-separated list of engines (hf, vllm); empty for none."""
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {"hf", "vllm"})
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown engine(s) {', '.join(unknown)}; use hf and/or vllm")
    return chosen


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per run; the first is not measured")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over all configurations")
    parser.add_argument("--quick", action="store_true", help="2 steps, 1 round: a smoke test")
    parser.add_argument(
        "--model",
        default="small",
        help="tiny model small (~25M) or demo (~1M), or a model folder with the tiny tokenizer",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU for both frameworks")
    parser.add_argument("--prompts", type=int, default=Workload.prompts)
    parser.add_argument("--group", type=int, default=Workload.group)
    parser.add_argument("--max-new-tokens", type=int, default=Workload.max_new_tokens)
    parser.add_argument("--micro-batch", type=int, default=Workload.micro_batch)
    parser.add_argument("--lr", type=float, default=Workload.lr)
    parser.add_argument("--kl-coef", type=float, default=Workload.kl_coef)
    parser.add_argument("--threads", type=int, default=2, help="CPUs (torch threads) of the single-rank runs")
    parser.add_argument("--kuberl-engines", type=names, default=["hf", "vllm"], help="comma-separated; '' for none")
    parser.add_argument("--trl-modes", type=names, default=["hf", "vllm"], help="comma-separated; '' for none")
    parser.add_argument(
        "--precisions", type=precisions, default=["fp32", "bf16"], help="training compute, comma-separated: fp32,bf16"
    )
    parser.add_argument("--no-two-ranks", dest="two_ranks", action="store_false", help="skip kuberl 2 ranks x 1 CPU")
    parser.add_argument(
        "--staleness",
        type=int,
        nargs="*",
        default=[],
        help="kuberl rows with a separate rollout replica and rollout.maxStaleness each of these (0: synchronous), "
        "the trainer and the replica on --threads / 2 CPUs each",
    )
    parser.add_argument("--json", type=Path, help="also write every run's raw figures here")
    parser.add_argument("--report", type=Path, help="print the table of the runs in this child-log folder, run none")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        return child_main(Workload(**spec["work"]), Config(**spec["config"]), args.child_out)
    work = Workload(
        model=args.model,
        prompts=args.prompts,
        group=args.group,
        max_new_tokens=args.max_new_tokens,
        micro_batch=args.micro_batch,
        lr=args.lr,
        kl_coef=args.kl_coef,
        steps=2 if args.quick else args.steps,
        device=args.device,
    )
    if (work.prompts * work.group) % work.micro_batch:
        raise SystemExit(f"--micro-batch {work.micro_batch} must divide prompts x group = {work.prompts * work.group}")
    if args.report:
        report(args.report, work)
        return 0
    repeats = 1 if args.quick else args.repeats
    order = configurations(args)
    rows = {config: Row(config) for config in order}
    raw: list[dict[str, Any]] = []
    log_dir = Path(tempfile.mkdtemp(prefix="vs-trl-logs-"))
    print(f"child logs in {log_dir}; load average at start {os.getloadavg()}", flush=True)
    for round_index in range(repeats):
        for config in order:
            started = time.perf_counter()
            result = run_child(work, config, log_dir)
            rows[config].add(result)
            raw.append(asdict(replace(result)))
            status = result.error or f"{len(result.steps)} steps, setup {result.setup_seconds:.0f} s {result.info}"
            print(
                f"round {round_index + 1}/{repeats} {config.label:<28} {time.perf_counter() - started:6.0f} s  "
                f"{status}  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print_table(list(rows.values()), work)
    print(f"load average at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"workload": asdict(work), "runs": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
