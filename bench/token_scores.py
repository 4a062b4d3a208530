"""Log-probs and entropies of one pass's response tokens, a slice at a time: from bf16 logits, or from the LM
head's input (--head).

    .venv/bin/python bench/token_scores.py                    # 4 rows x 768 tokens of a Qwen vocabulary
    .venv/bin/python bench/token_scores.py --quick            # 512 tokens
    .venv/bin/python bench/token_scores.py --head             # the head too: Qwen2.5-1.5B's (151,936 x 1,536)

From the logits, forward and backward. *slices*: `algorithms.token_scores` (what the trainer runs): float32 a
slice of 2^26 elements at a time, the softmax recomputed in backward. *whole*: the baseline, what the trainer ran
before: the logits upcast to float32 whole, `losses.logprobs_from_logits` and `losses.entropy_from_logits` on them,
autograd's backward.

With --head, a float32 head computing in bf16 under autocast, as a single rank's trainer does. *at head*:
`head_token_scores` (training.fusedLogProbs): the logits of a slice of tokens at a time, forward and again in
backward. *logits*: the head over every token (bf16 logits, whole), then the slices on them, the trainer's default.
Two passes: an update's (log-probs and entropy, forward and backward, the hidden states' and the head's gradients)
and a reference's (log-probs, no gradient).

Each variant runs in a process of its own, so its peak resident memory above the level with its inputs allocated is
its own (`ru_maxrss`); the time is the best of `--repeats`. The GPU suite has rows for both on a GPU (`token
scores`, `update, fused log-probs`).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
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


def child(args: argparse.Namespace, tokens: int) -> dict[str, float]:
    import torch
    from weight_sync import rss  # bench/weight_sync.py: this process's resident bytes

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, args.vocab, (tokens,), generator=generator)  # (K,)
    if args.child in ("slices", "whole"):
        logits = torch.randn(tokens, args.vocab, generator=generator).bfloat16().requires_grad_()  # (K, V)
        work = lambda: scored(logits, labels, args.child == "slices", args.grad == "yes")  # noqa: E731
    else:
        work = head_pass(args, tokens, labels, generator)
    before = rss()
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"seconds": best, "peak_extra_bytes": peak - before}


def head_pass(
    args: argparse.Namespace, tokens: int, labels: "torch.Tensor", generator: "torch.Generator"
) -> "Callable[[], None]":
    """A work: one pass of a float32 head (V, H) computing in bf16, its scores from the logits or at the head;
    with `--grad yes` an update's (log-probs and entropy, backward), else a reference's (log-probs, no gradient)."""
    import torch

    from kuberl.runtime.algorithms.token_scores import head_token_scores, token_scores

    grad = args.grad == "yes"
    hidden = torch.randn(tokens, args.hidden, generator=generator).requires_grad_(grad)  # (K, H) float32
    weight = (torch.randn(args.vocab, args.hidden, generator=generator) * args.hidden**-0.5).requires_grad_(grad)

    def work() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(grad):
            if args.child == "at head":
                scores = head_token_scores(hidden, weight, labels, compute_dtype=torch.bfloat16, entropy=grad)
            else:
                logits = torch.nn.functional.linear(hidden, weight)  # (K, V) bf16
                scores = token_scores(logits, labels, entropy=grad)
                del logits
        if grad:
            logprobs, entropy, _ = scores
            assert entropy is not None
            (logprobs.sum() + 0.01 * entropy.sum()).backward()
            hidden.grad = weight.grad = None

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3072, help="response tokens of the pass (default 4 x 768)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary (default Qwen2.5's)")
    parser.add_argument("--head", action="store_true", help="from the LM head's input, against from its logits")
    parser.add_argument("--hidden", type=int, default=1536, help="the head's hidden size (default Qwen2.5-1.5B's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="512 tokens")
    parser.add_argument("--child", choices=["slices", "whole", "at head", "logits"], help=argparse.SUPPRESS)
    parser.add_argument("--grad", choices=["yes", "no"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = 512 if args.quick else args.tokens
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(child(args, tokens)))  # noqa: T201
        return
    logits_mib = tokens * args.vocab * 2 / MIB
    shape = f"head {args.vocab} x {args.hidden} (float32, bf16 compute)" if args.head else f"{args.vocab} vocabulary"
    print(f"{tokens} tokens, {shape}, bf16 logits {logits_mib:.0f} MiB, {args.threads} threads, "  # noqa: T201
          f"load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    if args.head:  # the entropy and a backward in an update; neither in a reference's pass
        passes = {"update: log-probs and entropy, backward": "yes", "reference: log-probs, no gradient": "no"}
        ours, theirs = "at head", "logits"
    else:  # the entropy is the `grad` switch's second meaning here: both passes have a backward
        passes = {"log-probs": "no", "log-probs and entropy": "yes"}
        ours, theirs = "slices", "whole"
    print("| pass | variant | s (best) | peak extra MiB | x logits |")  # noqa: T201
    print("|---|---|---:|---:|---:|")  # noqa: T201
    ratios = []
    for name, grad in passes.items():
        results = {}
        for variant in (ours, theirs):
            command = [sys.executable, __file__, "--child", variant, "--grad", grad, "--tokens", str(tokens)]
            command += ["--vocab", str(args.vocab), "--hidden", str(args.hidden), "--repeats", str(args.repeats)]
            command += ["--threads", str(args.threads)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[variant] = json.loads(out.strip().splitlines()[-1])
        for variant, result in results.items():
            peak = result["peak_extra_bytes"] / MIB
            print(f"| {name} | {variant} | {result['seconds']:.3f} | {peak:.0f} | {peak / logits_mib:.2f} |")  # noqa: T201
        time_ratio = results[ours]["seconds"] / results[theirs]["seconds"]
        memory_ratio = results[ours]["peak_extra_bytes"] / results[theirs]["peak_extra_bytes"]
        ratios.append(f"{name.split(':')[0]}: time {time_ratio:.2f}x, peak extra memory {memory_ratio:.2f}x")
    print(f"\n{ours} / {theirs}, " + "; ".join(ratios))  # noqa: T201


if __name__ == "__main__":
    main()
