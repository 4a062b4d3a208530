"""Micro-batch size and gradient checkpointing change how an update is computed, never what it computes.

A role's micro-batch size (models.actor / models.critic microBatchSize) splits the update into more or fewer
forward/backward passes whose gradients accumulate into the same optimiser step; gradient checkpointing
(models.critic.gradientCheckpointing) recomputes each decoder layer in backward. Either way the weights after
the update are the same within float32 rounding, while the passes counted differ. Single CPU rank, in-process,
on a real FSDPTrainer and the real update loop (as in test_update_masks).
"""

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.updates import UpdateConfig, update_critic, update_policy
from kuberl.runtime.models.loading import VALUE_MODEL
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, make_batch, tiny_model

pytestmark = pytest.mark.integration

TOLERANCE = 1e-5


def tiny_critic() -> torch.nn.Module:
    from transformers import Qwen2ForTokenClassification

    torch.manual_seed(0)
    config = tiny_model().config
    config.update(VALUE_MODEL)  # as the model worker loads a critic
    return Qwen2ForTokenClassification(config).float()


def counted(trainer: FSDPTrainer) -> list[int]:
    """A counter of the calls into the first decoder layer's MLP (a recomputation in backward counts too: a
    pre-hook, as the recomputation stops once it has rebuilt what backward needs, before the MLP returns)."""
    calls = [0]
    trainer.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def updated(model: torch.nn.Module, update, micro: int, **trainer_options) -> tuple[dict, dict, int]:
    """The weights after one update with micro-batches of `micro`, its metrics, and the layer's forward calls."""
    trainer = FSDPTrainer(
        model, world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-2), total_steps=5, **trainer_options
    )
    calls = counted(trainer)
    batch = make_batch()
    batch.values = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(3))
    batch.returns = batch.advantages + batch.values
    config = UpdateConfig(world_size=1, **{**CONFIG, "mini_batches": 1, "micro_batch_size": micro})
    metrics = update(trainer, batch, config)
    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return weights, metrics, calls[0]


def largest_difference(a: dict, b: dict) -> float:
    return max(float((a[name] - b[name].detach()).abs().max()) for name in a)


def test_the_actors_micro_batch_size_changes_the_passes_not_the_update():
    whole, whole_metrics, whole_calls = updated(tiny_model(), update_policy, micro=8)
    split, split_metrics, split_calls = updated(tiny_model(), update_policy, micro=2)
    assert (whole_calls, split_calls) == (1, 4)  # 8 rows: one pass, or four of two
    assert (whole_metrics["actor/micro_batches"], split_metrics["actor/micro_batches"]) == (1.0, 4.0)
    assert largest_difference(whole, split) < TOLERANCE
    assert largest_difference(whole, {n: p for n, p in tiny_model().named_parameters()}) > 1e-4  # it trained


def test_the_critics_micro_batch_size_and_gradient_checkpointing_change_the_passes_not_the_update():
    whole, whole_metrics, whole_calls = updated(tiny_critic(), update_critic, micro=8)
    split, split_metrics, split_calls = updated(tiny_critic(), update_critic, micro=4)
    assert (whole_calls, split_calls) == (1, 2)
    assert (whole_metrics["critic/micro_batches"], split_metrics["critic/micro_batches"]) == (1.0, 2.0)
    assert largest_difference(whole, split) < TOLERANCE
    recomputed, _, recomputed_calls = updated(tiny_critic(), update_critic, micro=4, gradient_checkpointing=True)
    assert recomputed_calls == 2 * split_calls  # each layer runs again in backward
    assert largest_difference(split, recomputed) < TOLERANCE
