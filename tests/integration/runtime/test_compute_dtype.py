"""training.computeDtype bfloat16 on CPU: forward passes under autocast, weights and optimiser in fp32.

A single CPU rank keeps the plain module (no process group needed), so this runs in-process.
"""

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, make_batch, tiny_model

pytestmark = pytest.mark.integration


def trainer(compute_dtype: torch.dtype) -> FSDPTrainer:
    return FSDPTrainer(
        tiny_model(),
        world_size=1,
        device=torch.device("cpu"),
        optim=OptimizerSpec(lr=1e-2),
        total_steps=10,
        compute_dtype=compute_dtype,
    )


def test_bfloat16_compute_approximates_float32_and_full_precision_is_exact():
    batch = make_batch()
    fwd, mask = forward_input(batch), batch.response_mask.bool()
    fp32, bf16 = trainer(torch.float32), trainer(torch.bfloat16)
    exact = fp32.logprobs(fwd, 1.0, 4)[mask]
    fast = bf16.logprobs(fwd, 1.0, 4)[mask]
    assert 1e-5 < float((fast - exact).abs().max()) < 0.1  # bf16 really ran, and stayed close
    # the rollout.verifySync probe scores in the weights' own precision
    torch.testing.assert_close(bf16.logprobs(fwd, 1.0, 4, full_precision=True)[mask], exact, rtol=0, atol=0)


def test_bfloat16_update_keeps_float32_weights_and_moves_them_like_float32():
    config = UpdateConfig(world_size=1, **CONFIG)
    moved = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = trainer(dtype)
        before = {name: p.detach().clone() for name, p in model.model.named_parameters()}
        update_policy(model, make_batch(), config)
        after = dict(model.model.named_parameters())
        assert all(p.dtype == torch.float32 for p in after.values())
        assert all(s["exp_avg"].dtype == torch.float32 for s in model.optimizer.state.values())
        moved[dtype] = torch.cat([(after[n].detach() - before[n]).flatten() for n in before])
    # Adam's first steps are ~lr * sign(gradient): the bf16 update points the same way almost everywhere
    agree = (torch.sign(moved[torch.float32]) == torch.sign(moved[torch.bfloat16])).float().mean()
    assert float(moved[torch.bfloat16].abs().max()) > 1e-3 and float(agree) > 0.9
