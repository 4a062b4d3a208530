"""The GPU path measured on one machine: the trainer's update and its variants against plain PyTorch, the HF
engine, and where vLLM is installed the colocated vLLM engine (sleep/wake, the in-place sync, rollout speed).
One table at the end.

    bash bench/gpu/run.sh                    # everything: ~3 min on one H200 without vLLM (2026-11-28)
    bash bench/gpu/run.sh --models 0.5B      # one model
    bash bench/gpu/run.sh --dry-run          # no GPU work: the plan, the models' sizes, every row skipped
    bash bench/gpu/run.sh --smoke            # every row this machine can run, on a tiny model, on the CPU
    bash bench/gpu/run.sh --item "update, compiled" --item "offload update"   # only these trainer items

Needs torch, transformers and peft; nothing of the project is installed (run.sh puts the source on the path and
pydantic's wheels, when the machine lacks pydantic, from bench/gpu/wheels: see run.sh). Models are Qwen2.5-0.5B
and -1.5B shapes with random weights (`qwen.py`), built into --workdir first.

- The trainer rows (trainer_rows.py: update, LoRA, padding-free, offload, critic, KL, reference, checkpoint, HF
  engine) need neither vLLM nor Ray: one process, one rank, a process group made as the model worker makes it.
  The update rows' baseline is plain PyTorch on the same batch in the same run (plain.py). The update, LoRA and
  reference rows train the largest model asked for, the others the smallest.
- The vLLM rows (sleep/wake, sync, rollout) run where vLLM is installed and are skipped with the reason
  otherwise: sleep/wake frees the KV cache and the weights (level 1); the sync streams a bf16 copy of the model
  against a device-to-device copy (<= 1.5x); rollout is kuberl's `generate` against raw `LLM.generate` (>= 95%).
- grpo step: `bench/vs_trl.py --device cuda` on the smallest model, kuberl against TRL's best mode (needs TRL,
  vLLM and Ray).
- multi-GPU items run only with 2+ GPUs: a 2-rank update, and (with vLLM) the colocated engine split over 2 GPUs
  against one whole engine (rollout tokens/s, the sync, greedy agreement before and after it).
"""

import argparse
import gc
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))  # kuberl itself: the venv's editable install, or run.sh's PYTHONPATH

from qwen import QWEN25, build_model, peak_flops, qwen25_config, shape, smoke_config, update_flops  # noqa: E402
from table import FAILED, SKIPPED, Row, failed, format_table, judge, skipped  # noqa: E402
from workloads import PACKING, SMOKE, SMOKE_MODEL, SMOKE_PACKING, UPDATE, Workload  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
GIB = 2**30
NO_CUDA = "no CUDA device on this machine"
VLLM_ITEMS = ("sleep/wake", "sync", "rollout")
NOT_ASKED = "not asked for (--item)"


# -- the plan (no GPU needed) ------------------------------------------------------------------------
def trainer_items(sizes: list[str]) -> list[tuple[str, Callable[..., Any], str, str]]:
    """(item, its function, workload, model) of the trainer rows, in the order they run: the update's workloads
    on the largest model, the others on the smallest; a workload named for the larger model (the packing rows
    again, where passes keep the GPU busier) only when there are two sizes, or in --smoke's run on its one model,
    which runs every function."""
    from trainer_rows import LARGER_MODEL, TRAINER_ITEMS

    return [
        (item, measure, workload, sizes[-1] if workload in ("update", LARGER_MODEL) else sizes[0])
        for item, measure, workload in TRAINER_ITEMS
        if workload != LARGER_MODEL or len(set(sizes)) > 1 or sizes == [SMOKE_MODEL]
    ]


def planned_items(sizes: list[str], gpus: int) -> list[tuple[str, str]]:
    """(item, model) in the order they run; what --dry-run prints."""
    items = [(item, size) for item, _, _, size in trainer_items(sizes)]
    items += [(item, size) for size in sizes for item in VLLM_ITEMS]
    items += [("grpo step vs TRL", sizes[0]), ("fsdp2 nccl, 2 ranks", sizes[-1]), ("colocated vLLM, TP 2", sizes[-1])]
    items += [("separate rollout pool", sizes[0])]
    return items


def multi_gpu_reason(gpus: int) -> str | None:
    return None if gpus >= 2 else f"needs 2 GPUs, {gpus} visible"


def missing_modules(*names: str) -> list[str]:
    """The modules of `names` this Python cannot import (looked up, not imported)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a finder that refuses the name outright
            found = False
        if not found:
            missing.append(name)
    return missing


def dry_run_rows(sizes: list[str], reason: str) -> list[Row]:
    rows = []
    for item, size in planned_items(sizes, 0):
        params = shape(size).parameters
        rows.append(skipped(item, size, f"{reason}; model {params / 1e9:.2f}B parameters"))
    return rows


def job_spec(model_dir: Path, gpu_share: float = 0.4, max_new_tokens: int = 256, tensor_parallel: int = 1):
    """The job the vLLM rows run: its engine colocated, split over `tensor_parallel` of the actor's GPUs."""
    from kuberl.api import parse_rljob

    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "gpu-suite"},
        "spec": {
            "models": {"actor": {"path": str(model_dir), "dtype": "bfloat16"}},
            "data": {"train": "/data/train.jsonl", "maxPromptLength": 256},
            "reward": {"function": "math_exact"},
            "rollout": {
                "engine": "vllm",
                "maxNewTokens": max_new_tokens,
                "gpuMemoryUtilization": gpu_share,
                "tensorParallelSize": tensor_parallel,
            },
            "resources": {"actor": {"gpus": tensor_parallel}},
        },
    }
    return parse_rljob(manifest).spec


def best_of(repeats: int, *works: Callable[[], object]) -> list[float]:
    """The fastest of `repeats` timed runs of each work, alternating, with the GPU synchronised around each."""
    import torch

    best = [float("inf")] * len(works)
    for _ in range(repeats):
        for index, work in enumerate(works):
            torch.cuda.synchronize()
            started = time.perf_counter()
            work()
            torch.cuda.synchronize()
            best[index] = min(best[index], time.perf_counter() - started)
    return best


def free_gib() -> float:
    import torch

    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / GIB


# -- vLLM: one engine per model for sleep/wake, sync and rollout -----------------------------------------------
def engine_rows(size: str, model_dir: Path, repeats: int) -> list[Row]:
    import torch
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.base import SamplingParams
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine, to_vllm_sampling

    cuda = torch.device("cuda", 0)
    engine = VLLMRolloutEngine.create(job_spec(model_dir), str(model_dir), cuda)
    rows: list[Row] = []
    try:
        # sync: a bf16 copy of the model on the same GPU, streamed in; floor: device-to-device copy_
        trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(cuda)
        tensors = [(name, p.detach()) for name, p in trainer.named_parameters()]
        targets = [torch.empty_like(t) for _, t in tensors]

        def floor() -> None:
            for target, (_, tensor) in zip(targets, tensors, strict=True):
                target.copy_(tensor)

        def sync() -> None:
            engine.load_weights(iter(tensors))

        floor_s, sync_s = best_of(repeats, floor, sync)
        nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
        rows.append(
            judge(Row("sync", size, sync_s, "s", floor_s, "d2d copy", "<= 1.5x", note=f"{nbytes / GIB:.2f} GiB bf16"))
        )
        tensors.clear()
        targets.clear()
        del trainer
        torch.cuda.empty_cache()

        # rollout: kuberl's generate against raw LLM.generate with kuberl's own vLLM settings
        from vllm.inputs import TokensPrompt

        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 500, (128,), generator=generator).tolist() for _ in range(64)]
        params = SamplingParams(temperature=1.0, max_new_tokens=256, n=4, seed=1)
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        sampling = [to_vllm_sampling(params, i) for i in range(len(prompts))]
        counted: dict[str, int] = {}

        def kuberl() -> None:
            out = engine.generate(prompts, params)
            counted["kuberl"] = sum(len(g.token_ids) for gens in out for g in gens)

        def raw() -> None:
            out = engine.llm.generate(requests, sampling, use_tqdm=False)
            counted["raw"] = sum(len(c.token_ids) for o in out for c in o.outputs)

        kuberl()  # warm-up: CUDA graphs, allocator
        kuberl_s, raw_s = best_of(max(2, repeats // 2), kuberl, raw)
        kuberl_tps, raw_tps = counted["kuberl"] / kuberl_s, counted["raw"] / raw_s
        rows.append(
            judge(
                Row(
                    "rollout",
                    size,
                    100.0 * kuberl_tps / raw_tps,
                    "%",
                    None,
                    aim=">= 95%",
                    note=f"kuberl {kuberl_tps:,.0f} tok/s, raw LLM.generate {raw_tps:,.0f} tok/s (64 x 4 x 256)",
                )
            )
        )

        # sleep/wake around an update: the memory sleep gives the trainer
        before = free_gib()
        started = time.perf_counter()
        engine.sleep(1)
        sleep_s = time.perf_counter() - started
        after = free_gib()
        started = time.perf_counter()
        engine.wake_up()
        wake_s = time.perf_counter() - started
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # it still generates after waking
        rows.append(
            Row(
                "sleep/wake",
                size,
                after - before,
                "GiB freed",
                None,
                note=f"sleep {sleep_s:.2f} s, wake {wake_s:.2f} s; free {before:.1f} -> {after:.1f} GiB",
                status="ok" if after - before > 0.5 else "MISSED",
            )
        )
    finally:
        engine.shutdown()
    return rows


# -- two GPUs -----------------------------------------------------------------------------------------------
def _two_rank_update(rank: int, model_dir: str, port: int, out: dict) -> None:
    import torch
    import torch.distributed as dist
    from trainer_rows import kuberl_trainer, update_config
    from workloads import alternate, host_batch

    from kuberl.runtime.engines.fsdp import process_group_backend
    from kuberl.runtime.engines.updates import update_policy

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(process_group_backend("cuda"), rank=rank, world_size=2)
    try:
        work = Workload(UPDATE.sequences // 2, UPDATE.prompt, UPDATE.response, UPDATE.micro)
        trainer = kuberl_trainer(Path(model_dir), device)
        batch, config = host_batch(work, 512, seed=rank), update_config(work, world_size=2)
        (timing,) = alternate(device, 2, lambda: update_policy(trainer, batch, config))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out["seconds"] = timing.seconds


def _split_engine_rank(
    rank: int, world: int, model_dir: str, port: int, out: dict, device_type: str = "cuda", prompts: int = 64
) -> None:
    """One trainer rank holding its shard of a colocated vLLM engine split `world` ways (the hybrid engine at
    rollout.tensorParallelSize: world, vLLM's external launcher in the trainer's process group): greedy answers,
    an in-place sync of perturbed bf16 weights (what each rank gathers from FSDP), the answers again. (With
    device_type "cpu" and a tiny model it runs on vLLM's CPU build: how this function was checked off a GPU.)"""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # each rank sees its own GPU, as a Ray worker does
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    from kuberl.runtime.engines.base import SamplingParams
    from kuberl.runtime.engines.fsdp import process_group_backend
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    cuda = device_type == "cuda"
    device = torch.device(device_type, 0) if cuda else torch.device("cpu")
    synchronize = torch.cuda.synchronize if cuda else lambda: None
    if cuda:
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(process_group_backend(device_type), rank=rank, world_size=world)
    engine = VLLMRolloutEngine.create(job_spec(Path(model_dir), tensor_parallel=world), model_dir, device)
    try:
        generator = torch.Generator().manual_seed(0)
        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        batch = [torch.randint(3, min(vocab, 500), (128,), generator=generator).tolist() for _ in range(prompts)]
        params = SamplingParams(temperature=0.0, max_new_tokens=128)
        timed: dict[str, float] = {}

        def answers(when: str) -> list[list[int]]:
            synchronize()
            started = time.perf_counter()
            tokens = [generations[0].token_ids for generations in engine.generate(batch, params)]
            timed[when] = time.perf_counter() - started
            return tokens

        answers("warm-up")
        before = answers("before")
        trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
        noise = torch.Generator().manual_seed(5)  # the same perturbation on every rank
        weights = [
            (name, (p.detach().float() + 0.02 * torch.randn(p.shape, generator=noise).to(device)).to(p.dtype))
            for name, p in trainer.named_parameters()
        ]
        synchronize()
        started = time.perf_counter()
        engine.load_weights(iter(weights))
        synchronize()
        sync_s = time.perf_counter() - started
        after = answers("after")
    finally:
        engine.shutdown()  # vLLM's teardown destroys the default process group too
    if dist.is_initialized():
        dist.destroy_process_group()
    tokens = sum(len(answer) for answer in before)
    out[(world, rank)] = {"before": before, "after": after, "tps": tokens / timed["before"], "sync_s": sync_s}


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> float:
    """The share of greedy tokens that agree, each answer up to its first difference (bf16 sums in another
    order may pick another token at a near tie, and everything after it differs)."""
    same = total = 0
    for a, b in zip(ours, theirs, strict=True):
        total += max(len(a), len(b))
        for x, y in zip(a, b, strict=False):  # to the shorter answer
            if x != y:
                break
            same += 1
    return same / max(total, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def split_engine_row(model_dir: Path, size: str) -> Row:
    """The colocated engine split over 2 GPUs against one whole engine, in the same run: rollout tokens/s (the
    value), the sync, and how far the greedy answers agree before and after it. The two ranks of the split
    engine must answer alike (they generate together); otherwise the row FAILs."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_split_engine_rank, args=(1, str(model_dir), free_port(), out), nprocs=1)
        mp.spawn(_split_engine_rank, args=(2, str(model_dir), free_port(), out), nprocs=2)
        one, first, second = out[(1, 0)], out[(2, 0)], out[(2, 1)]
    if (first["before"], first["after"]) != (second["before"], second["after"]):
        return Row("colocated vLLM, TP 2", size, status=FAILED, note="the two ranks of one engine answered apart")
    note = (
        f"greedy tokens agreeing with TP 1: {agreement(first['before'], one['before']):.0%} before the sync, "
        f"{agreement(first['after'], one['after']):.0%} after; sync {first['sync_s']:.2f} s (TP 1 "
        f"{one['sync_s']:.2f} s); 64 x 128 tokens"
    )
    return Row("colocated vLLM, TP 2", size, first["tps"], "tok/s", one["tps"], "TP 1", note=note)


def two_rank_rows(model_dir: Path, size: str, gpus: int) -> list[Row]:
    reason = multi_gpu_reason(gpus)
    vllm_reason = reason or ("vLLM is not installed here" if missing_modules("vllm") else None)
    if reason:
        return [
            skipped("fsdp2 nccl, 2 ranks", size, reason),
            skipped("colocated vLLM, TP 2", size, reason),
            skipped("separate rollout pool", size, reason),
        ]
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_two_rank_update, args=(str(model_dir), free_port(), out), nprocs=2)
        seconds = out["seconds"]
    return [
        Row("fsdp2 nccl, 2 ranks", size, seconds, "s/update", note="32 x 1024 tokens over 2 GPUs"),
        skipped("colocated vLLM, TP 2", size, vllm_reason) if vllm_reason else split_engine_row(model_dir, size),
        skipped("separate rollout pool", size, "not yet in this suite (tests/integration covers it on CPU)"),
    ]


# -- one GRPO step against TRL ------------------------------------------------------------------------------
def grpo_rows(model_dir: Path, size: str, workdir: Path) -> list[Row]:
    missing = missing_modules("trl", "vllm", "ray")
    if missing:
        return [skipped("grpo step vs TRL", size, f"needs {', '.join(missing)}, not installed here", ">= 1.0x")]
    out = workdir / "vs_trl.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "vs_trl.py"),
        "--device=cuda",
        f"--model={model_dir}",
        "--kuberl-engines=vllm",
        "--trl-modes=vllm",
        "--precisions=bf16",
        "--repeats=1",
        "--steps=4",
        "--prompts=8",
        "--group=8",
        "--max-new-tokens=256",
        "--micro-batch=16",
        "--threads=4",
        "--no-two-ranks",
        f"--json={out}",
    ]
    subprocess.run(command, check=True, cwd=REPO, timeout=420)
    runs = json.loads(out.read_text())["runs"]
    steps = {run["config"]["framework"]: step_seconds(run["steps"]) for run in runs if not run["error"]}
    if set(steps) != {"kuberl", "trl"}:
        errors = "; ".join(run["error"] for run in runs if run["error"])
        return [Row("grpo step vs TRL", size, status="FAILED", note=errors[:160])]
    return [
        judge(
            Row(
                "grpo step vs TRL",
                size,
                steps["trl"],
                "s (TRL)",
                steps["kuberl"],
                "kuberl s",
                ">= 1.0x",
                note="ratio = TRL step / kuberl step; both vLLM colocated, bf16, 8 x 8 x 256 tokens",
            )
        )
    ]


def step_seconds(steps: list[dict]) -> float:
    """Median interval between consecutive step ends, the first (warm-up) step left out."""
    ends = [step["end"] for step in steps]
    return statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False))


# -- main ---------------------------------------------------------------------------------------------------
@dataclass
class Environment:
    """What the trainer rows share: the vocabulary, the device's bf16 peak, and the full update's timing per model
    (the LoRA row compares its memory with it)."""

    vocab: int
    peak: float | None
    flops_per_update: Callable[[str, Workload], float]
    full_update: dict[str, object] = field(default_factory=dict)

    def update_flops(self, size: str, work: Workload) -> float:
        return self.flops_per_update(size, work)


def run(
    sizes: list[str],
    workdir: Path,
    repeats: int,
    smoke: bool,
    rows: list[Row],
    made: Callable[[], None],
    items: set[str] | None = None,
) -> None:
    """Measures every row into `rows`, calling `made` after each item (a run cut short keeps what it measured);
    with `items` (--item), only those items, the others skipped as not asked for."""
    import torch
    from trainer_rows import LARGER_MODEL, Case, process_group

    def asked(*names: str) -> bool:
        return items is None or any(name in items for name in names)

    planned = trainer_items(sizes)
    needed = {size for item, _, _, size in planned if asked(item)} if items is not None else set(sizes)  # built

    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    gpus = torch.cuda.device_count() if cuda else 0

    def attempt(item: str, size: str, work: Callable[[], list[Row]]) -> None:
        started, before = time.perf_counter(), len(rows)
        try:
            rows.extend(work())
        except Exception as error:  # noqa: BLE001 - one failed item must not hide the others
            traceback.print_exc()  # the whole story in the log; the row keeps its first line
            rows.append(failed(item, size, error))
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        print(f"[{time.strftime('%H:%M:%S')}] {item} {size}: {time.perf_counter() - started:.0f} s", flush=True)
        print(format_table(rows[before:]), flush=True)
        made()

    configs = {size: smoke_config() if smoke else qwen25_config(size) for size in sizes}
    dirs = {
        size: build_model(configs[size], workdir / f"model-{size}", str(device)) for size in sizes if size in needed
    }
    # the offload rows: the update's batch (#38's shape: 32 x 1024 tokens, 8 passes) on the smaller model
    works = {"update": SMOKE if smoke else UPDATE, "packing": SMOKE_PACKING if smoke else PACKING}
    works["offload"], works[LARGER_MODEL] = works["update"], works["packing"]
    env = Environment(
        vocab=configs[sizes[0]].vocab_size,
        peak=peak_flops(torch.cuda.get_device_name()) if cuda else None,
        flops_per_update=lambda size, work: (
            0.0 if smoke else update_flops(shape(size), work.sequences, work.prompt + work.response)
        ),
    )
    with process_group(device):
        for item, measure, workload, size in planned:
            if not asked(item):
                rows.append(skipped(item, size, NOT_ASKED))
                continue
            case = Case(dirs[size], size, device, works[workload], repeats, env)
            attempt(item, size, lambda measure=measure, case=case: measure(case))
    if items is not None:  # --item names trainer items: the rest of the plan is not asked for
        rows.extend(skipped(item, size, NOT_ASKED) for item, size in planned_items(sizes, gpus)[len(planned) :])
        return
    vllm_reason = "vLLM is not installed here" if missing_modules("vllm") else None if cuda else NO_CUDA
    for size in sizes:
        if vllm_reason:
            rows.extend(skipped(item, size, vllm_reason) for item in VLLM_ITEMS)
        else:
            attempt("vLLM items", size, lambda s=size: engine_rows(s, dirs[s], repeats))
    if cuda:
        attempt("grpo step vs TRL", sizes[0], lambda: grpo_rows(dirs[sizes[0]], sizes[0], workdir))
    else:
        rows.append(skipped("grpo step vs TRL", sizes[0], NO_CUDA))
    attempt("multi-GPU", sizes[-1], lambda: two_rank_rows(dirs[sizes[-1]], sizes[-1], gpus))


def main(argv: list[str] | None = None) -> int:
    quiet_loading()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="0.5B,1.5B", help="comma-separated Qwen2.5 sizes: 0.5B, 1.5B")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="where the models are built (default: a temporary folder)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU work: the plan, every row skipped")
    parser.add_argument(
        "--smoke", action="store_true", help="every row on a tiny model on the CPU (a test of the suite)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--item",
        action="append",
        help="measure only this trainer item (repeatable; the names of --dry-run's first column, e.g. "
        "'update, compiled'): a lent GPU's minutes go to the rows in question",
    )
    args = parser.parse_args(argv)
    sizes = [s for s in args.models.split(",") if s]
    unknown = [s for s in sizes if s not in QWEN25]
    if not sizes or unknown:
        parser.error(f"--models: unknown {unknown or 'none given'}; known: {', '.join(QWEN25)}")
    if args.smoke:
        sizes = [SMOKE_MODEL]
    items = set(args.item) if args.item else None
    known = {item for item, *_ in trainer_items(sizes)}
    if items is not None and items - known:
        parser.error(f"--item: unknown {sorted(items - known)}; the trainer items: {', '.join(sorted(known))}")
    cuda = _cuda_available()
    rows: list[Row] = []

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps([row.__dict__ for row in rows], indent=1))

    interrupted = False
    if args.dry_run or not (cuda or args.smoke):
        rows = dry_run_rows(sizes, "dry run" if args.dry_run else NO_CUDA)
    else:
        try:
            with tempfile.TemporaryDirectory(prefix="kuberl-gpu-suite-") as scratch:
                repeats = 1 if args.smoke else args.repeats
                run(sizes, args.workdir or Path(scratch), repeats, args.smoke, rows, save, items)
        except KeyboardInterrupt:  # run.sh's time limit: the table of what was measured, marked as cut short
            interrupted = True
    print(format_table(rows))
    if interrupted:
        print(f"cut short (interrupted) after {len(rows)} rows: the rows after them were not measured")
    save()
    measured = [row for row in rows if row.status != SKIPPED]
    return 0 if not interrupted and all(row.status != "FAILED" for row in measured) else 1


def quiet_loading() -> None:
    """No progress bar or advice per model load: the table is what this prints."""
    try:
        import transformers
    except ImportError:
        return
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
