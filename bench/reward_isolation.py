"""What running a reward function in a child process costs (runtime/rewards/isolated.py).

    .venv/bin/python bench/reward_isolation.py            # tiny_task and math_exact, 4096 samples, batches of 32

*floor*: `score_batch` calling the built-in reward in this process, as before isolation; *isolated*:
`IsolatedRewardFunction.score` sending each batch to the child and receiving one result per sample.
Best of 5, alternating. The cost is per sample (pickling and a socket round trip), so it matters for
the cheapest rewards only; a reward that parses or verifies for a millisecond hides it.
"""

import argparse
import time

from kuberl.runtime.rewards.builtin import BUILTIN_REWARDS
from kuberl.runtime.rewards.functions import score_batch
from kuberl.runtime.rewards.isolated import IsolatedRewardFunction

SAMPLES = {
    "tiny_task": (" 6 7 8", {"answer": "6 7 8"}),
    "math_exact": ("so the answer is \\boxed{42}.", {"answer": "#### 42"}),
}


def best(repeats: int, call) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| reward | samples | floor ms | isolated ms | ratio | isolated us/sample |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (completion, sample) in SAMPLES.items():
        completions, samples = [completion] * args.samples, [sample] * args.samples
        isolated = IsolatedRewardFunction(name, timeout_s=60)
        isolated.score(completions[:1], samples[:1])  # the child has started and loaded the function

        def in_process(function=BUILTIN_REWARDS[name], completions=completions, samples=samples) -> None:
            for start in range(0, args.samples, args.batch):
                score_batch(function, completions[start : start + args.batch], samples[start : start + args.batch])

        def in_child(isolated=isolated, completions=completions, samples=samples) -> None:
            for start in range(0, args.samples, args.batch):
                isolated.score(completions[start : start + args.batch], samples[start : start + args.batch])

        floor, child = [], []
        for _ in range(args.repeats):  # alternate, so a noisy neighbour hits both
            floor.append(best(1, in_process))
            child.append(best(1, in_child))
        isolated.close()
        f, c = min(floor), min(child)
        per_sample = c / args.samples * 1e6
        print(f"| {name} | {args.samples} | {f * 1e3:.1f} | {c * 1e3:.1f} | {c / f:.1f} | {per_sample:.0f} |")


if __name__ == "__main__":
    main()
