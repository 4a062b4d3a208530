"""How one rank cuts its rows into micro-batches: a fixed number of rows per pass, or a token budget.

With a token budget (models.<role>.maxTokensPerMicroBatch; verl's use_dynamic_bsz with
*_max_token_len_per_gpu) consecutive rows share a pass while their real tokens (prompt + response,
padding not counted) fit the budget: many short responses go through in one pass, a long one gets a
pass of its own, so the memory of a pass follows the budget, not the longest row times a row count.

Every rank must run the same number of passes: each forward all-gathers the parameters of every FSDP
unit and each backward reduce-scatters the gradients, collectives all ranks join. The ranks agree on
the largest count any of them needs, and a rank that needs fewer splits its fullest micro-batches
further. That never leaves a pass empty: ranks hold equal numbers of rows (the controller lays them
out so), and no rank needs more passes than it has rows.

How the rows are cut never changes what an update computes: the denominators of each micro-batch's
loss are the counts of the whole mini-batch (runtime/engines/updates.py), so the gradients summed over the
passes are those of the mini-batch however it was cut.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class MicroBatching:
    """How a pass of one role is cut: `rows` per micro-batch, or up to `max_tokens` real tokens each."""

    rows: int  # models.<role>.microBatchSize / forwardMicroBatchSize
    max_tokens: int | None = None  # models.<role>.maxTokensPerMicroBatch; `rows` is then not used


def cut_by_rows(rows: int, size: int) -> list[slice]:
    return [slice(start, min(rows, start + size)) for start in range(0, rows, size)]


def cut_by_tokens(lengths: list[int], budget: int) -> list[slice]:
    """Consecutive rows per micro-batch while their tokens fit `budget` (a longer row goes alone).

    >>> cut_by_tokens([3, 4, 2, 6, 1], budget=7)
    [slice(0, 2, None), slice(2, 3, None), slice(3, 5, None)]
    """
    cuts: list[slice] = []
    start, tokens = 0, 0
    for row, length in enumerate(lengths):
        if row > start and tokens + length > budget:
            cuts.append(slice(start, row))
            start, tokens = row, 0
        tokens += length
    if lengths:
        cuts.append(slice(start, len(lengths)))
    return cuts


def split_to_count(cuts: list[slice], lengths: list[int], count: int) -> list[slice]:
    """Split the fullest micro-batches (by tokens, among those with two rows or more) until there are `count`.

    Each split halves a micro-batch's tokens as nearly as a row boundary allows; a split micro-batch stays
    within the budget its parent kept.

    >>> split_to_count([slice(0, 3), slice(3, 4)], [2, 2, 4, 5], 3)
    [slice(0, 2, None), slice(2, 3, None), slice(3, 4, None)]
    """
    cuts = list(cuts)
    while len(cuts) < count:
        splittable = [index for index, cut in enumerate(cuts) if cut.stop - cut.start > 1]
        if not splittable:
            raise ValueError(f"{len(lengths)} rows cannot make {count} non-empty micro-batches")
        index = max(splittable, key=lambda i: sum(lengths[cuts[i]]))
        cut = cuts[index]
        half = sum(lengths[cut]) / 2
        prefix, best, best_gap = 0, cut.start + 1, float("inf")
        for row in range(cut.start, cut.stop - 1):
            prefix += lengths[row]
            if abs(prefix - half) < best_gap:
                best, best_gap = row + 1, abs(prefix - half)
        cuts[index : index + 1] = [slice(cut.start, best), slice(best, cut.stop)]
    return cuts


def micro_batches(attention_mask: Tensor, batching: MicroBatching) -> list[slice]:
    """This rank's micro-batches of the rows of `attention_mask` (n, L); the same count on every rank.

    A collective when a token budget is set (every rank must call it for the same pass)."""
    rows = attention_mask.shape[0]
    if batching.max_tokens is None:
        return cut_by_rows(rows, batching.rows)  # equal rows on every rank: equal counts
    lengths = [int(length) for length in attention_mask.sum(-1)]  # (n,) real tokens per row
    cuts = cut_by_tokens(lengths, batching.max_tokens)
    return split_to_count(cuts, lengths, _largest_over_ranks(len(cuts)))


def _largest_over_ranks(count: int) -> int:
    total = torch.tensor(count, dtype=torch.int64)
    if dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.MAX)
    return int(total)
