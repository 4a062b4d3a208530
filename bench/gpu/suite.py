"""The GPU path measured on one machine: colocated vLLM with sleep/wake, the in-place sync, rollout speed,
update MFU, one GRPO step against TRL, FSDP2 over NCCL. One table at the end.

    bash bench/gpu/run.sh                    # everything, <= 10 min on one H100
    bash bench/gpu/run.sh --models 0.5B      # one model
    bash bench/gpu/run.sh --dry-run          # no GPU work: the plan, the models' sizes, every row skipped

Needs a CUDA machine with kuberl installed with the runtime and GPU extras (`pip install -e
'.[runtime,vllm]'`; TRL for the GRPO-step row: `.[bench]`). Models are Qwen2.5-0.5B and -1.5B shapes
with random weights (`qwen.py`), built into --workdir first. Items, each a row (or rows) of the table:

- sleep/wake: a colocated vLLM engine (kuberl's `VLLMRolloutEngine`, gpuMemoryUtilization 0.4)
  sleeps (level 1: KV cache dropped, weights offloaded) and wakes; the GPU memory sleep frees, and
  the seconds each takes. Aim: frees at least the KV cache.
- sync: `VLLMRolloutEngine.load_weights` streaming a bf16 copy of the model that lives on the same
  GPU (what `FSDPTrainer.full_tensors` yields on one rank) against a device-to-device `copy_` of the
  same tensors into preallocated ones. Aim: <= 1.5x.
- rollout: kuberl's `generate` (Generations with log-probs) against raw `vllm.LLM.generate` on the
  same engine with exactly the vLLM sampling settings kuberl builds, alternating. Aim: >= 95%.
- update MFU: one `update_policy` (the GRPO loss, forward + backward + AdamW) of the 1.5B model in
  bf16 (FSDP2 mixed precision, fp32 master weights) over one NCCL rank; model FLOPs / time / the
  GPU's dense bf16 peak. Aim: >= 35% on an H100. The row "fsdp2 nccl, 1 rank" is the same run.
- grpo step: `bench/vs_trl.py --device cuda` on the 0.5B shape, kuberl (vLLM colocated, bf16) against
  TRL's best mode (vLLM colocate, bf16); ratio = TRL's step / kuberl's.
- multi-GPU items (2-rank FSDP2, a separate rollout pool fed by broadcast) run only with 2+ GPUs
  and are skipped with the reason otherwise.
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE)] + ([str(REPO)] if str(REPO) not in sys.path else [])

from qwen import QWEN25, build_qwen25, peak_flops, shape, update_flops  # noqa: E402
from table import SKIPPED, Row, failed, format_table, judge, skipped  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
GIB = 2**30
NO_CUDA = "no CUDA device on this machine"


# -- the plan (no GPU needed) ------------------------------------------------------------------------
def planned_items(sizes: list[str], gpus: int) -> list[tuple[str, str]]:
    """(item, model) in the order they run; what --dry-run prints."""
    items = [(item, size) for size in sizes for item in ("sleep/wake", "sync", "rollout")]
    if "1.5B" in sizes:
        items += [("update MFU bf16", "1.5B"), ("fsdp2 nccl, 1 rank", "1.5B")]
    items += [("grpo step vs TRL", sizes[0]), ("fsdp2 nccl, 2 ranks", sizes[-1]), ("separate rollout pool", sizes[0])]
    return items


def multi_gpu_reason(gpus: int) -> str | None:
    return None if gpus >= 2 else f"needs 2 GPUs, {gpus} visible"


def dry_run_rows(sizes: list[str], reason: str) -> list[Row]:
    rows = []
    for item, size in planned_items(sizes, 0):
        params = shape(size).parameters
        rows.append(skipped(item, size, f"{reason}; model {params / 1e9:.2f}B parameters"))
    return rows


def job_spec(model_dir: Path, gpu_share: float = 0.4, max_new_tokens: int = 256):
    from kuberl.api import parse_rljob

    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "gpu-suite"},
        "spec": {
            "models": {"actor": {"path": str(model_dir), "dtype": "bfloat16"}},
            "data": {"train": "/data/train.jsonl", "maxPromptLength": 256},
            "reward": {"function": "math_exact"},
            "rollout": {"engine": "vllm", "maxNewTokens": max_new_tokens, "gpuMemoryUtilization": gpu_share},
            "resources": {"actor": {"gpus": 1}},
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


# -- per model: one engine for sleep/wake, sync and rollout -----------------------------------------------
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
        engine.sleep()
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


# -- update MFU, FSDP2 over NCCL ----------------------------------------------------------------------------
@contextlib.contextmanager
def nccl_group(rank: int = 0, world: int = 1, port: int | None = None) -> Iterator[None]:
    import torch.distributed as dist

    if port is None:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def update_seconds(model_dir: Path, world: int, sequences: int, prompt: int, response: int, repeats: int) -> float:
    """Seconds of one `update_policy` on this rank (bf16 FSDP2 mixed precision, fp32 AdamW), best of `repeats`."""
    import torch
    from transformers import AutoModelForCausalLM

    from kuberl.api.spec import OptimizerSpec
    from kuberl.runtime.batch import RolloutBatch
    from kuberl.runtime.engines.fsdp import FSDPTrainer
    from kuberl.runtime.updates import UpdateConfig, update_policy

    cuda = torch.device("cuda", torch.cuda.current_device())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = FSDPTrainer(
        model,
        world_size=world,
        device=cuda,
        optim=OptimizerSpec(lr=1e-6),
        total_steps=repeats + 1,
        compute_dtype=torch.bfloat16,
    )
    generator = torch.Generator().manual_seed(0)
    rows = sequences // world
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, 500, (rows, prompt), generator=generator),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
        response_ids=torch.randint(3, 500, (rows, response), generator=generator),
        response_mask=torch.ones(rows, response),
        group_index=torch.arange(rows) // 8,
        advantages=torch.randn(rows, response, generator=generator),
    )
    config = UpdateConfig(
        ppo_epochs=1,
        mini_batches=1,
        micro_batch_size=4,
        world_size=world,
        temperature=1.0,
        aggregation="seq_mean_token_mean",
        max_response_length=response,
        on_policy=True,
    )
    update_policy(trainer, batch, config)  # warm-up
    return best_of(repeats, lambda: update_policy(trainer, batch, config))[0]


def mfu_rows(model_dir: Path, size: str, repeats: int) -> list[Row]:
    import torch

    sequences, prompt, response = 32, 256, 768
    with nccl_group():
        seconds = update_seconds(model_dir, 1, sequences, prompt, response, repeats)
    flops = update_flops(shape(size), sequences, prompt + response)
    name = torch.cuda.get_device_name()
    peak = peak_flops(name)
    tokens = sequences * (prompt + response)
    rows = [
        Row(
            "fsdp2 nccl, 1 rank",
            size,
            seconds,
            "s/update",
            note=f"{tokens:,} tokens, micro-batch 4, fully_shard per layer over one NCCL rank",
        )
    ]
    if peak is None:
        rows.append(skipped("update MFU bf16", size, f"no bf16 peak known for {name}", ">= 35%"))
    else:
        mfu = 100.0 * flops / seconds / peak
        note = f"{flops / seconds / 1e12:.0f} TFLOP/s of {peak / 1e12:.0f} ({name})"
        rows.append(judge(Row("update MFU bf16", size, mfu, "%", aim=">= 35%", note=note)))
    return rows


def _two_rank_update(rank: int, model_dir: str, port: int, out: dict) -> None:
    import torch

    torch.cuda.set_device(rank)
    with nccl_group(rank, 2, port):
        seconds = update_seconds(Path(model_dir), 2, 32, 256, 768, 2)
    if rank == 0:
        out["seconds"] = seconds


def two_rank_rows(model_dir: Path, size: str, gpus: int) -> list[Row]:
    reason = multi_gpu_reason(gpus)
    if reason:
        return [skipped("fsdp2 nccl, 2 ranks", size, reason), skipped("separate rollout pool", size, reason)]
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_two_rank_update, args=(str(model_dir), port, out), nprocs=2)
        seconds = out["seconds"]
    return [
        Row("fsdp2 nccl, 2 ranks", size, seconds, "s/update", note="32 x 1024 tokens over 2 GPUs"),
        skipped("separate rollout pool", size, "not yet in this suite (tests/integration covers it on CPU)"),
    ]


# -- one GRPO step against TRL ------------------------------------------------------------------------------
def grpo_rows(model_dir: Path, size: str, workdir: Path) -> list[Row]:
    try:
        import trl  # noqa: F401
    except ImportError:
        return [skipped("grpo step vs TRL", size, "TRL is not installed (pip install -e '.[bench]')", ">= 1.0x")]
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
def run(sizes: list[str], workdir: Path, repeats: int) -> list[Row]:
    import torch

    gpus = torch.cuda.device_count()
    rows: list[Row] = []

    def attempt(item: str, size: str, work: Callable[[], list[Row]]) -> None:
        started = time.perf_counter()
        try:
            rows.extend(work())
        except Exception as error:  # noqa: BLE001 - one failed item must not hide the others
            rows.append(failed(item, size, error))
        print(f"[{time.strftime('%H:%M:%S')}] {item} {size}: {time.perf_counter() - started:.0f} s", flush=True)

    dirs = {size: build_qwen25(size, workdir / f"qwen2.5-{size}") for size in sizes}
    for size in sizes:
        attempt("engine items", size, lambda size=size: engine_rows(size, dirs[size], repeats))
    if "1.5B" in sizes:
        attempt("update MFU", "1.5B", lambda: mfu_rows(dirs["1.5B"], "1.5B", max(2, repeats // 2)))
    attempt("grpo step vs TRL", sizes[0], lambda: grpo_rows(dirs[sizes[0]], sizes[0], workdir))
    attempt("multi-GPU", sizes[-1], lambda: two_rank_rows(dirs[sizes[-1]], sizes[-1], gpus))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="0.5B,1.5B", help="comma-separated Qwen2.5 sizes: 0.5B, 1.5B")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="where the models are built (default: a temporary folder)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU work: the plan, every row skipped")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    sizes = [s for s in args.models.split(",") if s]
    unknown = [s for s in sizes if s not in QWEN25]
    if not sizes or unknown:
        parser.error(f"--models: unknown {unknown or 'none given'}; known: {', '.join(QWEN25)}")
    cuda = _cuda_available()
    if args.dry_run or not cuda:
        rows = dry_run_rows(sizes, "dry run" if args.dry_run else NO_CUDA)
    else:
        with tempfile.TemporaryDirectory(prefix="kuberl-gpu-suite-") as scratch:
            rows = run(sizes, args.workdir or Path(scratch), args.repeats)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ for row in rows], indent=1))
    measured = [row for row in rows if row.status != SKIPPED]
    return 0 if not measured or all(row.status != "FAILED" for row in measured) else 1


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
