"""FlexAttention over packed rows (runtime/models/packed_attention.py), forward only: FlexAttention has no backward
on the CPU, so its backward and its speed are measured on a GPU (bench/gpu/run.sh, test_gpu.py)."""

import pytest
import torch
from torch.nn import functional

from kuberl.runtime.engines.fsdp import position_ids
from kuberl.runtime.engines.packing import pack_rows
from kuberl.runtime.models import packed_attention
from kuberl.runtime.models.packed_attention import FLEX, flex_packed_attention, packed_block_mask, register_flex
from kuberl.runtime.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """tiny://demo: a Llama with 4 query heads over 2 key-value heads (grouped-query attention)."""
    return build_tiny_model("demo", tmp_path_factory.mktemp("packed-attention") / "demo")


def rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows as a micro-batch holds them: left-padded prompts, right-padded responses, one of each length."""
    torch.manual_seed(0)
    ids = torch.randint(3, 500, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a short prompt
    mask[1, 10:] = 0  # a short response
    mask[2, :2] = 0
    mask[2, 9:] = 0
    return ids, mask


def logits_at_real_tokens(model, ids, mask, packed: bool) -> torch.Tensor:
    """(real tokens, V) the model's logits at every real token, in row order."""
    with torch.no_grad():
        if not packed:
            return model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[mask.bool()]
        rows = pack_rows(ids, mask)
        return model(input_ids=rows.input_ids, position_ids=rows.position_ids).logits[0]


@pytest.mark.parametrize(
    ("autocast", "tolerance"),
    [(None, 1e-5), (torch.bfloat16, 2e-2)],  # bfloat16: the query and key arrive in float32 beside a bf16 value
    ids=["float32", "bfloat16-autocast"],
)
def test_a_packed_forward_through_flex_attention_matches_the_padded_forward(demo_dir, autocast, tolerance, monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention
    from transformers import AutoModelForCausalLM

    kernel_dtypes = []

    def recording_flex_attention(query, key, value, **options):
        kernel_dtypes.append((query.dtype, key.dtype, value.dtype))
        return flex_attention(query, key, value, **options)

    monkeypatch.setitem(packed_attention._flex_by_device, "cpu", recording_flex_attention)
    ids, mask = rows()
    padded_model = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    register_flex()
    flex_model = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32, attn_implementation=FLEX).eval()
    assert flex_model.config._attn_implementation == FLEX
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        padded = logits_at_real_tokens(padded_model, ids, mask, packed=False).float()
        packed = logits_at_real_tokens(flex_model, ids, mask, packed=True).float()
    assert packed.shape == (int(mask.sum()), padded_model.config.vocab_size)
    # one kernel call per layer, its three inputs in the dtype the padded forward's SDPA computes in
    assert kernel_dtypes == [(autocast or torch.float32,) * 3] * padded_model.config.num_hidden_layers
    torch.testing.assert_close(packed, padded, atol=tolerance, rtol=0)
    # and a row never sees its neighbours: the same packed forward under one sequence's mask differs
    with torch.no_grad():
        one_sequence = flex_model(input_ids=pack_rows(ids, mask).input_ids).logits[0].float()
    assert (one_sequence - packed).abs().max() > 10 * tolerance


def test_the_block_mask_is_causal_within_each_sequence_and_its_window_only():
    torch.manual_seed(1)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5]])
    sequence = torch.tensor([0] * 5 + [1] * 3 + [2] * 6)
    query, key, value = torch.randn(1, 2, 14, 8), torch.randn(1, 2, 14, 8), torch.randn(1, 2, 14, 8)
    from torch.nn.attention.flex_attention import flex_attention

    for window in (None, 2):
        allowed = (sequence[:, None] == sequence[None]) & torch.ones(14, 14, dtype=torch.bool).tril()
        if window is not None:
            allowed &= torch.arange(14)[:, None] - torch.arange(14)[None] < window
        expected = functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed)
        got = flex_attention(query, key, value, block_mask=packed_block_mask(position_ids, window))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_padded_rows_are_refused_naming_the_setting_that_packs_them():
    query = torch.zeros(2, 4, 6, 8)  # two rows: a padded micro-batch
    with pytest.raises(ValueError, match=r"training\.paddingFree.*not a batch of 2 padded rows"):
        flex_packed_attention(torch.nn.Module(), query, query, query, None, position_ids=torch.zeros(2, 6))
