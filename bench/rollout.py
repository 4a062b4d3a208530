"""Benchmark kuberl's rollout stage against raw vLLM: generated tokens per second on CPU.

    .venv/bin/python bench/rollout.py [--quick] [--model small] [--prompts 8] [--group 4] [--tokens 48]
        [--repeats 5] [--threads 1]

Two engines in this process, on identical prompts, run alternately `--repeats` times:

1. kuberl: `VLLMRolloutEngine.generate` with the SamplingParams the controller passes (temperature
   1, top_p 1, n = group size, eos as stop token, a seed), returning Generations with the
   sampled tokens' log-probs;
2. raw: a plain `vllm.LLM` built with vLLM's defaults (its packed oneDNN GEMMs on CPU), given
   exactly the vLLM sampling settings kuberl builds (`to_vllm_sampling`: the same per-prompt
   seeds, `logprobs=0`, no detokenization) — the floor for this work;
3. raw+text: the same with vLLM's default `detokenize=True`, what a plain vLLM user writes.

Prints tokens/s of each (best and median run) and kuberl's ratio to raw (target >= 90%): the
difference is kuberl's wrapper (per-prompt seeds, Generation objects, the eager log-prob rank on CPU
applies to both engines since it is process-wide).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

KV_CACHE_BYTES = 128 << 20


def job_spec(model_dir: Path, prompt_length: int, tokens: int):
    from kuberl.api import parse_rljob

    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "bench-rollout"},
        "spec": {
            "models": {"actor": {"path": str(model_dir)}},
            "data": {"train": "/data/train.jsonl", "maxPromptLength": prompt_length},
            "reward": {"function": "math_exact"},
            "rollout": {"engine": "vllm", "maxNewTokens": tokens, "kvCacheBytes": KV_CACHE_BYTES},
        },
    }
    return parse_rljob(manifest).spec


def make_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 16..48 random non-special token ids."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 49, (count,), generator=generator).tolist()
    return [torch.randint(3, vocab, (length,), generator=generator).tolist() for length in lengths]


def timed_tokens(work: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    tokens = work()
    return tokens, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 1M demo model, 8 prompts, 3 repeats")
    parser.add_argument("--model", default="small", help="a tiny model name (demo ~1M, small ~25M)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (n)")
    parser.add_argument("--tokens", type=int, default=48, help="max new tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (vLLM serves with 1; so do kuberl workers)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.model, args.prompts, args.repeats = "demo", 8, 3

    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from kuberl.runtime.engines.base import SamplingParams
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine, to_vllm_sampling
    from kuberl.runtime.models.tiny import TINY_MODELS, build_tiny_model

    with tempfile.TemporaryDirectory(prefix="kuberl-bench-rollout-") as root:
        model_dir = build_tiny_model(args.model, Path(root) / args.model)
        spec = job_spec(model_dir, 48, args.tokens)
        prompts = make_prompts(args.prompts, TINY_MODELS[args.model].vocab_size)
        kuberl = VLLMRolloutEngine.create(spec, str(model_dir), torch.device("cpu"))
        raw = LLM(
            model=str(model_dir),
            dtype="float32",
            seed=spec.training.seed,
            max_model_len=48 + args.tokens + 1,
            enforce_eager=True,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        eos = raw.get_tokenizer().eos_token_id
        params = SamplingParams(
            temperature=1.0, top_p=1.0, max_new_tokens=args.tokens, n=args.group, stop_token_ids=(eos,), seed=7
        )
        raw_settings = [to_vllm_sampling(params, index) for index in range(len(prompts))]
        text_settings = [s.clone() for s in raw_settings]
        for setting in text_settings:
            setting.detokenize = True
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def run_kuberl() -> int:
            return sum(len(g.token_ids) for gens in kuberl.generate(prompts, params) for g in gens)

        def run_raw(settings: list) -> int:
            outputs = raw.generate(requests, settings, use_tqdm=False)
            return sum(len(c.token_ids) for out in outputs for c in out.outputs)

        works = {
            "kuberl": run_kuberl,
            "raw": lambda: run_raw(raw_settings),
            "raw+text": lambda: run_raw(text_settings),
        }
        for work in works.values():  # warm up: first-request allocations
            work()
        rates: dict[str, list[float]] = {name: [] for name in works}
        for _ in range(args.repeats):
            for name, work in works.items():
                tokens, seconds = timed_tokens(work)
                rates[name].append(tokens / seconds)

        print(
            f"model={args.model} prompts={args.prompts} n={args.group} max_new_tokens={args.tokens} "
            f"repeats={args.repeats} threads={torch.get_num_threads()} load={os.getloadavg()[0]:.2f}"
        )
        print(f"{'engine':>9} {'best tok/s':>11} {'median tok/s':>13}")
        for name, values in rates.items():
            print(f"{name:>9} {max(values):>11.1f} {statistics.median(values):>13.1f}")
        for baseline in ("raw", "raw+text"):
            best = max(rates["kuberl"]) / max(rates[baseline])
            median = statistics.median(rates["kuberl"]) / statistics.median(rates[baseline])
            print(f"kuberl / {baseline}: best {best:.1%}, median {median:.1%}")


if __name__ == "__main__":
    main()
