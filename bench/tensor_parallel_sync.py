"""Benchmark a weight sync into a tensor-parallel vLLM engine (rollout.tensorParallelSize: 2, CPU build).

    .venv/bin/python bench/tensor_parallel_sync.py [--model 100M] [--repeats 3]

A split engine's shards live in worker processes of vLLM's mp executor, so a sync's tensors are pickled
to each of them (runtime/engines/vllm.py). For a random fp32 Qwen2 model (bench/weight_sync.py's), prints
for a 2-way split engine, alternating, best of `--repeats`:

1. layers: `VLLMRolloutEngine.load_weights`, which sends one decoder layer per call (`layer_loads`);
2. whole: the baseline, the whole model as one list in one call (what a single call must send);

each with the seconds and the peak resident memory above the level before the sync, summed over this
process and the shard processes (sampled every 5 ms), beside the model's and its largest layer's size.
The claim it checks: the per-layer sync holds about (1 + shards) x the largest layer, not x the model.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))
sys.path.insert(0, str(REPO / "bench"))

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

MB = 1 << 20


def family_rss() -> int:
    """Resident bytes of this process and every process it started (the engine's shard workers)."""
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="100M", choices=["1M", "25M", "100M"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from weight_sync import build_model, job_manifest, peak_extra_rss

    from kuberl.api import parse_rljob
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine, _refresh_shared_gemms, layer_loads

    torch.set_num_threads(2)  # a core per shard
    with tempfile.TemporaryDirectory() as root:
        model_dir = build_model(args.model, Path(root) / args.model)
        manifest = job_manifest(model_dir)
        manifest["spec"]["rollout"].update(placement="separate", tensorParallelSize=2)
        manifest["spec"]["resources"] = {"rollout": {"cpus": 2}}
        spec = parse_rljob(manifest).spec
        from transformers import AutoModelForCausalLM

        weights = {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
        model_mb = sum(t.numel() * t.element_size() for t in weights.values()) / MB
        layer_mb = max(sum(t.numel() * t.element_size() for _, t in load) for load in layer_loads(weights.items())) / MB
        started = time.perf_counter()
        engine = VLLMRolloutEngine.create(spec, str(model_dir), torch.device("cpu"))
        print(f"2-way split engine started in {time.perf_counter() - started:.1f} s", flush=True)

        def per_layer() -> None:
            engine.load_weights(iter(weights.items()))

        def whole() -> None:
            engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            engine.llm.collective_rpc(_refresh_shared_gemms)

        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeats):
            for name, work in (("layers", per_layer), ("whole", whole)):
                seconds, peak = peak_extra_rss(work, measure=family_rss, every=0.005)
                old = best.get(name, (float("inf"), 1 << 62))
                best[name] = (min(old[0], seconds), min(old[1], peak))
        engine.shutdown()

    load = os.getloadavg()[0]
    print(f"\nmodel {args.model}: {model_mb:.1f} MB, largest layer {layer_mb:.1f} MB; load {load:.2f}")
    print("| sync | s | peak extra RSS (this + 2 shards) | x model | x largest layer |")
    print("|---|---:|---:|---:|---:|")
    for name, (seconds, peak) in best.items():
        extra = peak / MB
        print(f"| {name} | {seconds:.3f} | {extra:.1f} MB | {extra / model_mb:.2f} | {extra / layer_mb:.2f} |")
    layers, whole_ = best["layers"], best["whole"]
    print(f"\nper-layer / whole: time {layers[0] / whole_[0]:.2f}x, peak memory {layers[1] / max(whole_[1], 1):.2f}x")


if __name__ == "__main__":
    main()
