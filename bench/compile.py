"""Compiled decoder layers (training.compile) against the eager model: forwards and updates on the CPU.

    .venv/bin/python bench/compile.py               # hidden 512, 8 layers, 16 rows, responses up to 256 tokens
    .venv/bin/python bench/compile.py --quick       # hidden 256, 4 layers, 8 rows, up to 128 tokens: a smoke test

A random Qwen2 (`--hidden`, `--layers`, vocabulary 8192; fp32, CPU, one FSDPTrainer rank, `--threads` torch
threads) and padding_free.py's batch of mixed lengths, padded (`--packed`: packed). Two trainers of the same
weights, one with each decoder layer's forward compiled by torch.compile (inductor's C++ code here), the other
eager. First the compiled trainer's first forward and update, timed apart: they compile (with and without
gradients). Then padding_free.py's rounds: the old-log-prob forward and one policy update of each, alternating,
the best and the median seconds, compiled / eager, and the largest log-prob difference between the two. On a
GPU the suite's "update, compiled" row measures the same switch at 1.5B (bench/gpu/run.sh).
"""

import argparse
import os
import time

import torch
from padding_free import compare, mixed_batch, model, update_config

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import update_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--budget", type=int, default=256, help="response tokens at most")
    parser.add_argument("--hidden", type=int, default=512, help="the model's hidden size")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--packed", action="store_true", help="packed forwards (training.paddingFree) on both sides")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.budget, args.hidden, args.layers, args.rounds = 8, 128, 256, 4, 2
    torch.set_num_threads(args.threads)
    batch = mixed_batch(args.rows, args.budget)
    config = update_config(batch, args.micro)
    print(
        f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, hidden {args.hidden} x {args.layers} layers, "
        f"{args.rows} rows x {batch.input_ids.shape[1]} positions, {'packed' if args.packed else 'padded'}"
    )
    trainers = {
        mode: FSDPTrainer(
            model(args.hidden, args.layers),
            world_size=1,
            device=torch.device("cpu"),
            optim=OptimizerSpec(lr=1e-5),
            total_steps=args.rounds + 2,
            padding_free=args.packed,
            compile_layers=mode == "compiled",
        )
        for mode in ("compiled", "eager")
    }
    compiled = trainers["compiled"]
    started = time.perf_counter()
    compiled.logprobs(forward_input(batch), 1.0, args.micro)
    forwarded = time.perf_counter()
    update_policy(compiled, batch, config)
    updated = time.perf_counter()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    first = f"first forward {forwarded - started:.1f} s, first update {updated - forwarded:.1f} s"
    print(f"{first} (compiling {graphs} graphs)")
    trainers["eager"].logprobs(forward_input(batch), 1.0, args.micro)  # the same work once each before the rounds
    update_policy(trainers["eager"], batch, config)
    compare(trainers, batch, config, args.rounds, args.micro)


if __name__ == "__main__":
    main()
