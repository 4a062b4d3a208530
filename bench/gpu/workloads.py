"""The batches the GPU suite's rows train on, and how a row is timed: shared by kuberl and its baselines.

A workload is a number of sequences of a prompt and a response width, cut into micro-batches; `real` is the
share of each width that holds real tokens on average (1.0: no padding). Prompts are left-padded and
responses right-padded, as the rollout lays them out. Token ids are random: the rows measure speed, and the
models' weights are random too (qwen.py).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

GIB = 2**30


@dataclass(frozen=True)
class Workload:
    sequences: int
    prompt: int  # P, the prompt width
    response: int  # R, the response width
    micro: int  # rows per forward/backward pass
    real: float = 1.0  # mean share of the widths holding real tokens

    @property
    def length(self) -> int:
        """Columns of a row: P + R."""
        return self.prompt + self.response


#: The update rows' batch (issue #38's measurements): 32 x 1024 tokens, micro-batch 4.
UPDATE = Workload(sequences=32, prompt=256, response=768, micro=4)
#: The padding-free row's: about half of it padding.
PACKING = Workload(sequences=16, prompt=256, response=768, micro=4, real=0.5)
#: `--smoke` (the CPU run of the tests): the same rows on a model of a few thousand parameters, of this size name.
SMOKE_MODEL = "smoke"
SMOKE = Workload(sequences=4, prompt=6, response=10, micro=2)
SMOKE_PACKING = Workload(sequences=4, prompt=6, response=10, micro=2, real=0.5)


def lengths(count: int, width: int, real: float, generator: torch.Generator) -> torch.Tensor:
    """(count,) lengths in [1, width] whose mean is about `real` x width (uniform above a floor)."""
    low = max(1, round(width * (2 * real - 1)))
    return torch.randint(low, width + 1, (count,), generator=generator)  # (count,)


def host_batch(work: Workload, vocab: int, seed: int = 0):
    """A RolloutBatch on the host with every field an update reads: advantages, reference and engine log-probs,
    and a critic's values and returns (the controller's job, done here with random numbers)."""
    from kuberl.runtime.batch import RolloutBatch

    generator = torch.Generator().manual_seed(seed)
    n, width_p, width_r = work.sequences, work.prompt, work.response
    prompt_mask = torch.arange(width_p).flip(0)[None] < lengths(n, width_p, work.real, generator)[:, None]  # (N, P)
    response_mask = torch.arange(width_r)[None] < lengths(n, width_r, work.real, generator)[:, None]  # (N, R)
    response_mask = response_mask.float()  # (N, R)

    def noise(scale: float = 1.0) -> torch.Tensor:
        return torch.randn(n, width_r, generator=generator) * scale * response_mask  # (N, R)

    return RolloutBatch(
        prompt_ids=torch.randint(3, min(vocab, 500), (n, width_p), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask.long(),
        response_ids=torch.randint(3, min(vocab, 500), (n, width_r), generator=generator),
        response_mask=response_mask,
        group_index=torch.arange(n) // 4,
        advantages=noise(),
        ref_logprobs=noise(0.1) - 2.0 * response_mask,
        engine_logprobs=noise(0.1) - 2.0 * response_mask,
        values=noise(),
        returns=noise(),
        scored=torch.ones(n, dtype=torch.bool),
    )


@dataclass(frozen=True)
class Timing:
    seconds: float  # the fastest run
    peak_bytes: int | None  # the device memory allocated at most during a run (None off CUDA)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(device: torch.device, repeats: int, *works: Callable[[], object]) -> list[Timing]:
    """Each work once to warm up, then `repeats` rounds of all of them in turn: the fastest run of each, and its
    peak device memory. Alternating spreads whatever else the machine does over all of them alike."""
    for work in works:
        work()
    best = [float("inf")] * len(works)
    peaks = [0] * len(works)
    for _ in range(repeats):
        for index, work in enumerate(works):
            synchronize(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            started = time.perf_counter()
            work()
            synchronize(device)
            best[index] = min(best[index], time.perf_counter() - started)
            if device.type == "cuda":
                peaks[index] = max(peaks[index], torch.cuda.max_memory_allocated(device))
    return [Timing(seconds, peak if device.type == "cuda" else None) for seconds, peak in zip(best, peaks, strict=True)]


def gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.1f} GiB"
