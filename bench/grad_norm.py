"""The gradient norm of host gradients: torch's own against kuberl's (engines/grad_norm.py), on a real model's shapes.

    .venv/bin/python bench/grad_norm.py                 # Qwen2.5-0.5B's 290 gradients, 494M fp32 values (2 GB)
    .venv/bin/python bench/grad_norm.py --quick         # the same layout at a quarter of the width: a smoke test

An offloaded model's optimiser step (models.<role>.offload) clips by the norm of gradients in host memory, and a
CPU trainer's does too. One H200 machine's host took 0.26 s of a 1.6 s offloaded 0.5B update on torch's norm
(bench/gpu/results/2026-11-28-offload-probe.txt). Random gradients (N(0, 1e-3)) of every parameter's shape,
in float32. Both norms run alternately, `--repeats` rounds; prints the best seconds of each, their ratio, and how
far each lands from the float64 norm of the same values; and the best seconds of a scale by 1 of every gradient,
the pass the step made below the clip until it skipped it.
"""

import argparse
import time

import torch

from kuberl.runtime.engines.grad_norm import gradient_norm


def gradients(size: str, quick: bool) -> list[torch.Tensor]:
    """Random float32 gradients of every parameter of Qwen2.5-`size`, the tied embedding once."""
    from gpu.qwen import qwen25_config
    from transformers import Qwen2ForCausalLM

    config = qwen25_config(size)
    if quick:
        config.hidden_size, config.intermediate_size, config.vocab_size = 224, 1216, 37984
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    return [
        torch.empty(param.shape).normal_(0.0, 1e-3, generator=generator)
        for param in model.parameters()  # a tied head is the embedding: parameters() yields it once
    ]


def float64_norm(grads: list[torch.Tensor]) -> float:
    return sum(float(grad.double().square().sum()) for grad in grads) ** 0.5


def timed(work, times: list[float]) -> torch.Tensor:
    """`work()`, its seconds appended to `times`."""
    started = time.perf_counter()
    result = work()
    times.append(time.perf_counter() - started)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.5B", help="a Qwen2.5 size of bench/gpu/qwen.py (default 0.5B)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    grads = gradients(args.size, args.quick)
    values = sum(grad.numel() for grad in grads)
    largest = max(grad.numel() for grad in grads)
    exact = float64_norm(grads)
    works = {
        "torch": lambda: torch.nn.utils.get_total_norm(grads),
        "kuberl": lambda: gradient_norm(grads, torch.device("cpu"), world_size=1),
    }
    one = torch.tensor(1.0)

    def scale_by_one() -> torch.Tensor:
        """What the step did below the clip, before it skipped it: every gradient times a coefficient of 1, one
        `mul_` per FSDP2 DTensor gradient (clip_grads_with_norm_ has no foreach path for DTensors)."""
        for grad in grads:
            grad.mul_(one)
        return one

    times: dict[str, list[float]] = {name: [] for name in [*works, "scale by 1"]}
    results: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, work in works.items():
            results[name] = float(timed(work, times[name]))
        timed(scale_by_one, times["scale by 1"])
    print(
        f"Qwen2.5-{args.size}{' (quarter width)' if args.quick else ''}: {len(grads)} gradients, {values:,} "
        f"float32 values ({values * 4 / 2**30:.2f} GiB), the largest {largest:,}; {args.threads} threads; "
        f"best of {args.repeats}, alternating"
    )
    print(f"float64 norm: {exact:.9f}")
    print("| norm | best s | vs torch | norm | relative error |")
    print("|---|---:|---:|---:|---:|")
    for name in works:
        seconds = min(times[name])
        error = abs(results[name] - exact) / exact
        print(f"| {name} | {seconds:.4f} | {seconds / min(times['torch']):.2f}x | {results[name]:.9f} | {error:.1e} |")
    print(
        f"scaling every gradient by 1, as the step did below the clip (now skipped): {min(times['scale by 1']):.4f} s"
    )


if __name__ == "__main__":
    main()
