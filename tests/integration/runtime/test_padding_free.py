"""training.paddingFree: packed forwards give the padded forward's log-probs, values and update, without the padding.

A real FSDPTrainer (single CPU rank, in-process, as in test_micro_batches) on a batch of mixed prompt and
response lengths: 64 real tokens in an 8 x 11 padded tensor. The packed forward computes those 64 tokens in
one row, the padded forward all 88 positions. Tolerance 1e-5: the two compute each real token from the same
tokens in the same order; what differs is the attention matrices' sizes (11 vs 64 keys, masked), so float32
sums of a different length (observed ~1e-7).
"""

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, make_batch, tiny_model
from tests.integration.runtime.test_micro_batches import tiny_critic

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5


def trainer(model: torch.nn.Module, padding_free: bool, optim: OptimizerSpec | None = None) -> FSDPTrainer:
    return FSDPTrainer(
        model, world_size=1, device=torch.device("cpu"), optim=optim, total_steps=5, padding_free=padding_free
    )


def positions_computed(trainer: FSDPTrainer) -> list[int]:
    """Sequence positions the first decoder layer computes, per forward call (rows x columns)."""
    seen: list[int] = []
    trainer.model.model.layers[0].register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[:2].numel()))
    return seen


def test_packed_log_probs_and_values_equal_the_padded_forwards_without_computing_the_padding():
    batch = make_batch()
    fwd, mask = forward_input(batch), batch.response_mask
    real_tokens = int(batch.attention_mask.sum())
    assert (real_tokens, batch.attention_mask.numel()) == (64, 88)
    results = {}
    for padding_free in (False, True):
        actor, critic = trainer(tiny_model(), padding_free), trainer(tiny_critic(), padding_free)
        computed = positions_computed(actor)
        logprobs = actor.logprobs(fwd, temperature=1.0, micro_batch_size=8)  # (8, R)
        values = critic.values(fwd, micro_batch_size=4)  # (8, R)
        results[padding_free] = (logprobs * mask, values * mask, computed)
    (padded_lp, padded_v, padded_seen), (packed_lp, packed_v, packed_seen) = results[False], results[True]
    assert (padded_seen, packed_seen) == ([88], [real_tokens])
    torch.testing.assert_close(packed_lp, padded_lp, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(packed_v, padded_v, rtol=0, atol=TOLERANCE)
    assert float(padded_lp.abs().max()) > 1.0 and float(padded_v.abs().max()) > 0.05  # not trivially equal


def test_a_packed_update_equals_the_padded_update():
    weights = {}
    for padding_free in (False, True):
        actor = trainer(tiny_model(), padding_free, OptimizerSpec(lr=1e-2))
        update_policy(actor, make_batch(), UpdateConfig(world_size=1, **{**CONFIG, "mini_batches": 1}))
        weights[padding_free] = {name: p.detach().clone() for name, p in actor.model.named_parameters()}
    initial = {name: p.detach() for name, p in tiny_model().named_parameters()}
    assert max(float((weights[False][n] - initial[n]).abs().max()) for n in initial) > 1e-3  # it trained
    for name, tensor in weights[False].items():
        torch.testing.assert_close(weights[True][name], tensor, rtol=0, atol=TOLERANCE, msg=name)
