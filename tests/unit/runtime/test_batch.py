"""RolloutBatch: sharding across ranks and putting results back together keeps every row intact."""

import torch

from kuberl.runtime.batch import RolloutBatch


def batch(rows: int, prompt_width: int = 3, response_width: int = 4, offset: int = 0) -> RolloutBatch:
    ids = torch.arange(rows)[:, None] + offset
    return RolloutBatch(
        prompt_ids=ids.repeat(1, prompt_width),
        prompt_mask=torch.ones(rows, prompt_width, dtype=torch.long),
        response_ids=ids.repeat(1, response_width),
        response_mask=torch.ones(rows, response_width),
        group_index=torch.arange(rows) // 2,
        scores=torch.arange(rows, dtype=torch.float32),
        texts=[f"r{i + offset}" for i in range(rows)],
        samples=[{"i": i + offset} for i in range(rows)],
    )


def test_shards_are_contiguous_and_cover_every_row_once():
    shards = batch(7).shard(3)
    assert [len(s) for s in shards] == [2, 3, 2]  # sizes differ by at most one
    assert torch.cat([s.scores for s in shards]).tolist() == list(range(7))
    assert [t for s in shards for t in s.texts] == [f"r{i}" for i in range(7)]


def test_concat_of_shards_is_the_batch():
    whole = batch(6)
    again = RolloutBatch.concat(whole.shard(2))
    for name, value in whole.tensor_fields().items():
        assert torch.equal(getattr(again, name), value), name
    assert again.samples == whole.samples


def test_concat_pads_prompts_on_the_left_and_responses_on_the_right():
    narrow = batch(1, prompt_width=2, response_width=2)
    wide = batch(1, prompt_width=4, response_width=5, offset=9)
    merged = RolloutBatch.concat([narrow, wide])
    assert merged.prompt_mask[0].tolist() == [0, 0, 1, 1]  # left padding keeps the prompt next to the response
    assert merged.response_mask[0].tolist() == [1, 1, 0, 0, 0]
    assert merged.input_ids.shape == (2, 9)


def test_select_reorders_tensors_and_lists_together():
    picked = batch(4).select([3, 0])
    assert picked.scores.tolist() == [3.0, 0.0]
    assert picked.texts == ["r3", "r0"] and picked.samples == [{"i": 3}, {"i": 0}]
