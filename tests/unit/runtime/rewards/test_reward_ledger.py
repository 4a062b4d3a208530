"""The reward pool's ledger: each sample index takes its first result; late duplicates are dropped."""

import pytest

from kuberl.runtime.rewards.functions import RewardResult
from kuberl.runtime.rewards.ledger import ResultLedger


def test_results_come_out_in_index_order_whatever_order_batches_finish() -> None:
    ledger = ResultLedger(4)
    ledger.fill([2, 3], [RewardResult(2.0), RewardResult(3.0)])
    ledger.fill([0, 1], [RewardResult(0.0), RewardResult(1.0)])
    assert [result.score for result in ledger.results()] == [0.0, 1.0, 2.0, 3.0]


def test_a_late_duplicate_is_dropped_and_counted() -> None:
    ledger = ResultLedger(2)
    ledger.fill([0, 1], [RewardResult(0.5), RewardResult(1.5)])  # the requeued batch finished first
    dropped = ledger.fill([0, 1], [RewardResult(9.0), RewardResult(9.0)])  # the presumed-dead worker's answer
    assert dropped == 2
    assert [result.score for result in ledger.results()] == [0.5, 1.5]


def test_results_before_every_sample_is_filled_is_an_error() -> None:
    ledger = ResultLedger(3)
    ledger.fill([0], [RewardResult(1.0)])
    assert ledger.missing == 2 and not ledger.complete
    with pytest.raises(RuntimeError, match="2 of 3 samples have no reward result"):
        ledger.results()


def test_results_that_do_not_pair_with_indices_are_refused() -> None:
    with pytest.raises(ValueError, match="1 reward results for 2 samples"):
        ResultLedger(2).fill([0, 1], [RewardResult(1.0)])
