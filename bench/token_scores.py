"""Log-probs and entropies of one pass's response tokens, forward and backward, from bf16 logits.

    .venv/bin/python bench/token_scores.py                    # 4 rows x 768 tokens of a Qwen vocabulary
    .venv/bin/python bench/token_scores.py --quick            # 512 tokens

*slices*: `algorithms.token_scores` (what the trainer runs): float32 a slice of 2^26 elements at a time, the
softmax recomputed in backward. *whole*: the baseline, what the trainer ran before: the logits upcast to float32
whole, `losses.logprobs_from_logits` and `losses.entropy_from_logits` on them, autograd's backward. Each variant
runs in a process of its own, so its peak resident memory above the level with the logits allocated is its own
(`ru_maxrss`); the time is the best of `--repeats`. The GPU suite has the same row on a GPU (`token scores`).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MIB = 2**20


def scored(logits: "torch.Tensor", labels: "torch.Tensor", slices: bool, entropy: bool) -> None:
    """One forward and backward of the scores of `logits` (K, V) that requires grad: the trainer's slices, or the
    whole float32 computation it ran before. The GPU suite's `token scores` rows run this too."""
    from kuberl.runtime.algorithms.losses import entropy_from_logits, logprobs_from_logits
    from kuberl.runtime.algorithms.token_scores import token_scores

    if slices:
        logprobs, entropies, _ = token_scores(logits, labels, 1.0, entropy=entropy)
    else:
        z = logits.float()  # (K, V)
        logprobs, entropies = logprobs_from_logits(z, labels), entropy_from_logits(z) if entropy else None
    loss = logprobs.sum() if entropies is None else logprobs.sum() + 0.01 * entropies.sum()
    loss.backward()
    logits.grad = None


def child(variant: str, entropy: bool, tokens: int, vocab: int, repeats: int) -> dict[str, float]:
    import torch
    from weight_sync import rss  # bench/weight_sync.py: this process's resident bytes

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=generator).bfloat16().requires_grad_()  # (K, V)
    labels = torch.randint(0, vocab, (tokens,), generator=generator)  # (K,)
    before = rss()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        scored(logits, labels, variant == "slices", entropy)
        best = min(best, time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"seconds": best, "peak_extra_bytes": peak - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3072, help="response tokens of the pass (default 4 x 768)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (default Qwen2.5's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="512 tokens")
    parser.add_argument("--child", choices=["slices", "whole"], help=argparse.SUPPRESS)
    parser.add_argument("--entropy", choices=["yes", "no"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = 512 if args.quick else args.tokens
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        result = child(args.child, args.entropy == "yes", tokens, args.vocab, args.repeats)
        print(json.dumps(result))  # noqa: T201
        return
    logits_mib = tokens * args.vocab * 2 / MIB
    print(f"{tokens} tokens x {args.vocab} vocabulary, bf16 logits {logits_mib:.0f} MiB, {args.threads} threads, "  # noqa: T201
          f"load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    print("| scores | variant | s (best) | peak extra MiB | x logits |")  # noqa: T201
    print("|---|---|---:|---:|---:|")  # noqa: T201
    ratios = []
    for entropy in ("no", "yes"):
        results = {}
        for variant in ("slices", "whole"):
            command = [sys.executable, __file__, "--child", variant, "--entropy", entropy, "--tokens", str(tokens)]
            command += ["--vocab", str(args.vocab), "--repeats", str(args.repeats), "--threads", str(args.threads)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[variant] = json.loads(out.strip().splitlines()[-1])
        scores = "log-probs and entropy" if entropy == "yes" else "log-probs"
        for variant, result in results.items():
            peak = result["peak_extra_bytes"] / MIB
            print(f"| {scores} | {variant} | {result['seconds']:.3f} | {peak:.0f} | {peak / logits_mib:.2f} |")  # noqa: T201
        slices, whole = results["slices"], results["whole"]
        time_ratio = slices["seconds"] / whole["seconds"]
        memory_ratio = slices["peak_extra_bytes"] / whole["peak_extra_bytes"]
        ratios.append(f"{scores}: time {time_ratio:.2f}x, peak extra memory {memory_ratio:.2f}x")
    print("\nslices / whole, " + "; ".join(ratios))  # noqa: T201


if __name__ == "__main__":
    main()
