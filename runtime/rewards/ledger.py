"""The reward pool's record of which samples have a result: every index filled exactly once.

A batch travels to a worker as a list of sample indices. When its worker dies the batch is sent
again to another; if the first worker's answer still arrives (a worker that was only unreachable
for a while) the indices it fills are already filled, and those late results are dropped. So a
sample is never scored twice into the training batch and never lost.
"""

from kuberl.runtime.rewards.functions import RewardResult


class ResultLedger:
    """Results by sample index, `size` of them; each index takes its first result only."""

    def __init__(self, size: int) -> None:
        self._results: list[RewardResult | None] = [None] * size
        self._missing = size

    def fill(self, indices: list[int], results: list[RewardResult]) -> int:
        """Records results[k] for indices[k]; returns how many were dropped as late duplicates."""
        if len(indices) != len(results):
            raise ValueError(f"{len(results)} reward results for {len(indices)} samples; they must pair up")
        dropped = 0
        for index, result in zip(indices, results, strict=True):
            if self._results[index] is None:
                self._results[index] = result
                self._missing -= 1
            else:
                dropped += 1
        return dropped

    def is_filled(self, index: int) -> bool:
        return self._results[index] is not None

    @property
    def missing(self) -> int:
        return self._missing

    @property
    def complete(self) -> bool:
        return self._missing == 0

    def results(self) -> list[RewardResult]:
        """All results in index order; only once complete."""
        if not self.complete:
            raise RuntimeError(f"{self._missing} of {len(self._results)} samples have no reward result yet")
        return [result for result in self._results if result is not None]
