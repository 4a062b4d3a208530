"""Cutting a rank's rows into micro-batches by a token budget, and packing rows without their padding."""

import pytest
import torch

from kuberl.runtime.engines.micro_batches import MicroBatching, cut_by_tokens, micro_batches, split_to_count
from kuberl.runtime.engines.packing import pack_rows


def test_rows_share_a_micro_batch_while_their_tokens_fit_the_budget():
    # 3+4 = 7 fits 7; +2 would not; 2 alone; 6+1 = 7 fits
    assert cut_by_tokens([3, 4, 2, 6, 1], budget=7) == [slice(0, 2), slice(2, 3), slice(3, 5)]


def test_a_row_longer_than_the_budget_goes_alone():
    assert cut_by_tokens([2, 9, 2], budget=5) == [slice(0, 1), slice(1, 2), slice(2, 3)]


def test_splitting_to_a_larger_count_halves_the_fullest_micro_batch():
    # [2, 2, 4] holds 8 tokens, [5] one row: the first splits where its tokens halve, after 2 + 2
    assert split_to_count([slice(0, 3), slice(3, 4)], [2, 2, 4, 5], 3) == [slice(0, 2), slice(2, 3), slice(3, 4)]
    assert split_to_count([slice(0, 4)], [1, 1, 1, 1], 4) == [slice(i, i + 1) for i in range(4)]


def test_more_micro_batches_than_rows_is_refused():
    with pytest.raises(ValueError, match="2 rows cannot make 3"):
        split_to_count([slice(0, 2)], [1, 1], 3)


def test_without_a_budget_micro_batches_hold_a_row_count():
    mask = torch.ones(5, 3)
    assert micro_batches(mask, MicroBatching(rows=2)) == [slice(0, 2), slice(2, 4), slice(4, 5)]


def test_a_budget_counts_real_tokens_not_padding():
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 1, 0]])  # 2, 4 and 1 real tokens
    assert micro_batches(mask, MicroBatching(rows=1, max_tokens=6)) == [slice(0, 2), slice(2, 3)]


def test_packing_keeps_real_tokens_with_positions_restarting_per_row():
    ids = torch.tensor([[0, 5, 6, 0], [7, 8, 9, 4]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]])  # left-padded prompt, right-padded response
    packed = pack_rows(ids, mask)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1, 2, 3]]
    assert packed.index.tolist() == [[-1, 0, 1, -1], [2, 3, 4, 5]]  # -1: padding, not packed
