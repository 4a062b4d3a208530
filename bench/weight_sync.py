"""Benchmark the hybrid engine's weight sync: trainer tensors into the vLLM engine in place.

    .venv/bin/python bench/weight_sync.py [--quick] [--repeats 10] [--fsdp] [--lora] [--threads 1]

For Qwen2 models of about 1M, 25M and 100M parameters (random fp32 weights, built here), prints:

1. floor: copying the same tensors once, in this process, into preallocated tensors (`copy_`) —
   what any in-place sync must at least do;
2. sync: `VLLMRolloutEngine.load_weights` streaming the tensors from a model's `named_parameters`
   (what `FSDPTrainer.full_tensors` yields, without the gather), and its ratio to the floor
   (target at 100M: at most 3x);
3. peak extra memory during the sync (resident set above the level before it, sampled every
   millisecond), beside the model's size: the sync must not hold a second full copy.

The fastest of `--repeats` runs each, floor and sync alternating (the machine may be shared).
`--fsdp` also runs a 2-rank FSDP2 (gloo) job on the 25M model in which each rank gathers its
shards (`full_tensors`) and loads them into its own engine — the colocated hybrid engine — and
prints the gather alone and gather+load.

`--lora` also runs a LoRA run's syncs on each model (`spec.models.actor.lora`: rank 8 on every linear
layer and on the head, adapters that look trained): *adapter* streams the adapter from a single-rank
trainer (`models.lora.sync_payload`) into an engine built with LoRA (`load_adapter`: vLLM builds the
adapter from memory); *merged* merges the adapters into the blocks they touch and reloads those
(`lora.sync: merged`). Both against the full sync and the floor of the same model, alternating.

On CPU the sync is bounded by vLLM's GEMM repacking (every linear layer is rebuilt and repacked
for oneDNN in fresh memory), not by the copy; runtime/engines/vllm.py explains the trade-off.
"""

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


#: head_dim = hidden / heads stays >= 32 (vLLM's CPU attention minimum); embeddings tied.
SHAPES = {
    "1M": Shape(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=512, vocab=512),
    "25M": Shape(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, vocab=2048),
    "100M": Shape(hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2048, vocab=32000),
}


def build_model(name: str, directory: Path) -> Path:
    """A random Qwen2 model folder (config, safetensors, the tiny byte-level tokenizer)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from kuberl.runtime.models.tiny import build_tiny_tokenizer

    shape = SHAPES[name]
    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    build_tiny_tokenizer(512).save_pretrained(directory)
    return directory


def job_spec(model_dir: Path, lora: dict | None = None):
    from kuberl.api import parse_rljob

    return parse_rljob(job_manifest(model_dir, lora)).spec


def job_manifest(model_dir: Path, lora: dict | None = None) -> dict:
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "bench-weight-sync"},
        "spec": {
            "models": {"actor": {"path": str(model_dir)}},
            "data": {"train": "/data/train.jsonl", "maxPromptLength": 64},
            "reward": {"function": "math_exact"},
            "rollout": {"engine": "vllm", "maxNewTokens": 64, "kvCacheBytes": 64 << 20},
        },
    }
    if lora is not None:
        manifest["spec"]["models"]["actor"]["lora"] = lora
    return manifest


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_extra_rss(
    work: Callable[[], object], measure: Callable[[], int] = rss, every: float = 0.001
) -> tuple[float, int]:
    """Seconds `work` takes and the peak of `measure` (resident memory) above its level before, sampled `every` s."""
    base, peak, done = measure(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], measure() - base)
            time.sleep(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return seconds, max(peak[0], measure() - base)


def best_of(repeats: int, *works: Callable[[], object]) -> list[float]:
    """The fastest of `repeats` runs of each work, the works alternating (a shared machine's load hits all)."""
    best = [float("inf")] * len(works)
    for _ in range(repeats):
        for index, work in enumerate(works):
            started = time.perf_counter()
            work()
            best[index] = min(best[index], time.perf_counter() - started)
    return best


def bench_model(name: str, repeats: int, root: Path) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    model_dir = build_model(name, root / name)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = [(n, p.detach()) for n, p in trainer.named_parameters()]
    nbytes = sum(p.numel() * p.element_size() for _, p in params)
    engine = VLLMRolloutEngine.create(job_spec(model_dir), str(model_dir), torch.device("cpu"))

    targets = [torch.empty_like(p) for _, p in params]

    def floor() -> None:
        for target, (_, tensor) in zip(targets, params, strict=True):
            target.copy_(tensor)

    def sync() -> None:
        engine.load_weights((n, p) for n, p in params)

    floor()
    sync()  # warm: first-call allocations
    floor_s, sync_s = best_of(repeats, floor, sync)
    targets.clear()  # the floor's copies would count against the sync's peak memory
    _, extra = peak_extra_rss(sync)
    engine.shutdown()
    return {
        "params": sum(p.numel() for _, p in params),
        "bytes": nbytes,
        "floor_s": floor_s,
        "sync_s": sync_s,
        "peak_extra": extra,
    }


# -- optional: a LoRA run's syncs against the full sync ------------------------------------------------
LORA = {"rank": 8, "alpha": 16, "trainHead": True}


def lora_trainer(model_dir: Path, lora: dict):
    """A single-rank LoRA trainer of the model whose adapters look trained (B != 0)."""
    from transformers import AutoModelForCausalLM

    from kuberl.api import parse_rljob
    from kuberl.runtime.engines.fsdp import FSDPTrainer
    from kuberl.runtime.models.lora import apply_lora

    spec = parse_rljob(job_manifest(model_dir, lora)).spec
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = apply_lora(model, spec.models.actor.lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.01)
    return FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)


def payload_bytes(weights) -> int:
    return sum(tensor.numel() * tensor.element_size() for _, tensor in weights)


def bench_lora(name: str, repeats: int, root: Path) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.vllm import VLLMRolloutEngine
    from kuberl.runtime.models.lora import load_into, sync_payload

    model_dir = root / name if (root / name / "config.json").exists() else build_model(name, root / name)
    full = [(n, p.detach()) for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()]
    # the merged sync of a head adapter needs an untied head; these models tie it, so it adapts the blocks only
    lora_merged = {**LORA, "trainHead": False, "sync": "merged"}
    trainers = {"adapter": lora_trainer(model_dir, LORA), "merged": lora_trainer(model_dir, lora_merged)}
    cpu = torch.device("cpu")
    engines = {
        "full": VLLMRolloutEngine.create(job_spec(model_dir), str(model_dir), cpu),
        "adapter": VLLMRolloutEngine.create(job_spec(model_dir, LORA), str(model_dir), cpu),
        "merged": VLLMRolloutEngine.create(job_spec(model_dir, lora_merged), str(model_dir), cpu),
    }
    targets = [torch.empty_like(p) for _, p in full]

    def floor() -> None:
        for target, (_, tensor) in zip(targets, full, strict=True):
            target.copy_(tensor)

    def lora_sync(mode: str) -> Callable[[], object]:
        return lambda: load_into(engines[mode], mode, sync_payload(trainers[mode], mode))

    works = {
        "floor": floor,
        "full": lambda: engines["full"].load_weights(iter(full)),
        "adapter": lora_sync("adapter"),
        "merged": lora_sync("merged"),
    }
    for work in works.values():
        work()  # warm: first-call allocations
    timings = dict(zip(works, best_of(repeats, *works.values()), strict=True))
    sizes = {mode: payload_bytes(sync_payload(trainers[mode], mode)) for mode in trainers}
    for engine in engines.values():
        engine.shutdown()
    return {
        **timings,
        "bytes": payload_bytes(full),
        "adapter_bytes": sizes["adapter"],
        "merged_bytes": sizes["merged"],
    }


# -- optional: 2-rank FSDP gather + load (the colocated hybrid engine) ----------------------------------
def _fsdp_rank(rank: int, world: int, port: int, model_dir: str, repeats: int, out: dict) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.fsdp import FSDPTrainer
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = FSDPTrainer(model, world_size=world, device=torch.device("cpu"), optim=None, total_steps=0)
    engine = VLLMRolloutEngine.create(job_spec(Path(model_dir)), model_dir, torch.device("cpu"))

    def gather() -> None:
        for _ in trainer.full_tensors():
            pass

    def gather_load() -> None:
        engine.load_weights(trainer.full_tensors())

    gather_load()
    timings = best_of(repeats, gather, gather_load)
    dist.barrier()
    if rank == 0:
        out["gather_s"], out["gather_load_s"] = timings[0], timings[1]
    engine.shutdown()  # takes the default process group down with it (vLLM's teardown)


def bench_fsdp(repeats: int, root: Path) -> dict[str, float]:
    import torch.multiprocessing as mp

    model_dir = build_model("25M", root / "fsdp-25M")
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_fsdp_rank, args=(2, port, str(model_dir), repeats, out), nprocs=2)
        return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M and 25M only, 2 repeats")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fsdp", action="store_true", help="also time a 2-rank FSDP gather + load (25M)")
    parser.add_argument("--lora", action="store_true", help="also time a LoRA run's adapter and merged syncs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (as kuberl workers run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = ["1M", "25M"] if args.quick else list(SHAPES)
    repeats = 2 if args.quick else args.repeats
    print(f"threads={torch.get_num_threads()} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} repeats={repeats}")
    header = f"{'model':>6} {'params':>11} {'MB':>7} {'floor s':>9} {'sync s':>9} {'ratio':>6} {'sync GB/s':>9}"
    rows = []
    with tempfile.TemporaryDirectory(prefix="kuberl-bench-sync-") as root:
        for name in names:
            r = bench_model(name, repeats, Path(root))
            rows.append(
                f"{name:>6} {r['params']:>11,} {r['bytes'] / 2**20:>7.1f} {r['floor_s']:>9.4f} {r['sync_s']:>9.4f} "
                f"{r['sync_s'] / r['floor_s']:>6.2f} {r['bytes'] / r['sync_s'] / 1e9:>9.2f}"
                f"   peak extra RSS {r['peak_extra'] / 2**20:.1f} MB = {r['peak_extra'] / r['bytes']:.2f}x model"
            )
        print(header)
        print("\n".join(rows))
        if args.lora:
            print(
                f"\nLoRA rank {LORA['rank']} on every linear layer and the head; seconds, best of {repeats}:\n"
                f"{'model':>6} {'model MB':>9} {'adapter MB':>10} {'merged MB':>9} {'floor':>8} {'full':>8} "
                f"{'adapter':>8} {'merged':>8} {'full/adapter':>12} {'adapter/floor':>13} {'merged/full':>11}"
            )
            for name in names:
                r = bench_lora(name, repeats, Path(root))
                print(
                    f"{name:>6} {r['bytes'] / 2**20:>9.1f} {r['adapter_bytes'] / 2**20:>10.2f} "
                    f"{r['merged_bytes'] / 2**20:>9.1f} {r['floor']:>8.4f} "
                    f"{r['full']:>8.4f} {r['adapter']:>8.4f} {r['merged']:>8.4f} {r['full'] / r['adapter']:>12.1f} "
                    f"{r['adapter'] / r['floor']:>13.2f} {r['merged'] / r['full']:>11.2f}"
                )
        if args.fsdp:
            fsdp = bench_fsdp(max(1, repeats // 2), Path(root))
            print(
                f"fsdp 2 ranks, 25M: gather {fsdp['gather_s']:.4f}s, gather+load {fsdp['gather_load_s']:.4f}s "
                f"(load share {fsdp['gather_load_s'] - fsdp['gather_s']:.4f}s)"
            )


if __name__ == "__main__":
    main()
