"""The actor update trains only the tokens it should: bypass-mode rejection and failed rewards leave no gradient.

A single CPU rank keeps the plain module (no process group needed), so this runs in-process, on a real
FSDPTrainer and the real update loop.
"""

from dataclasses import replace

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.algorithms.correction import CorrectionConfig
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, make_batch, tiny_model

pytestmark = pytest.mark.integration

REJECT_OUTSIDE_HALF_TO_TWO = CorrectionConfig(None, 2.0, "token", 0.5, 2.0)


def trainer() -> FSDPTrainer:
    return FSDPTrainer(
        tiny_model(), world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-2), total_steps=5
    )


def moved_by_update(batch, config: UpdateConfig) -> tuple[float, dict[str, float]]:
    """The largest parameter change of one update, and its metrics."""
    model = trainer()
    before = {name: p.detach().clone() for name, p in model.model.named_parameters()}
    metrics = update_policy(model, batch, config)
    return max(float((p.detach() - before[n]).abs().max()) for n, p in model.model.named_parameters()), metrics


def engine_batch(offset: float):
    """make_batch() with the 'engine' log-probs (bypass: the old log-probs) = the trainer's own + offset."""
    batch = make_batch()
    current = trainer().logprobs(forward_input(batch), 1.0, 4)  # (N, R)
    batch.old_logprobs = (current + offset) * batch.response_mask
    batch.engine_logprobs = batch.old_logprobs
    return batch


def test_bypass_rejection_of_every_token_leaves_the_weights_alone() -> None:
    config = UpdateConfig(world_size=1, **{**CONFIG, "mini_batches": 1}, bypass_correction=REJECT_OUTSIDE_HALF_TO_TWO)
    # the engine found every sampled token e^3 = 20x less likely than the trainer does: all outside [0.5, 2]
    moved, metrics = moved_by_update(engine_batch(-3.0), config)
    assert metrics["correction/rejected_fraction"] == 1.0
    assert moved == 0.0
    # the same tokens, with the engine agreeing: nothing rejected, the update moves the weights
    moved, metrics = moved_by_update(engine_batch(0.0), config)
    assert metrics["correction/rejected_fraction"] == 0.0
    assert moved > 1e-4


def test_samples_whose_reward_failed_train_nothing() -> None:
    config = UpdateConfig(world_size=1, **{**CONFIG, "mini_batches": 1})
    batch = engine_batch(0.0)
    nothing_scored = replace(batch, loss_mask=torch.zeros_like(batch.response_mask))
    moved, _ = moved_by_update(nothing_scored, config)
    assert moved == 0.0
    half_scored = replace(batch, loss_mask=batch.response_mask * (torch.arange(len(batch)) % 2 == 0)[:, None])
    moved, _ = moved_by_update(half_scored, config)
    assert moved > 1e-4


def episode_batch():
    """make_batch() as multi-turn episodes: in rows with room, response tokens 1 and 2 are an observation."""
    batch = make_batch()
    observation = torch.zeros_like(batch.response_mask)  # (N, R)
    long_enough = batch.response_mask.sum(-1) >= 4  # (N,)
    observation[long_enough, 1:3] = 1.0
    batch.response_mask = batch.response_mask * (1 - observation)
    batch.observation_mask = observation
    batch.loss_mask = batch.response_mask  # every sample scored: the controller's training_tokens
    batch.ref_logprobs = batch.old_logprobs - 0.1
    return batch


def updated_weights(batch, config: UpdateConfig) -> dict[str, torch.Tensor]:
    model = trainer()
    update_policy(model, batch, config)
    return {name: p.detach().clone() for name, p in model.model.named_parameters()}


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum_norm"])
def test_what_sits_on_an_environment_token_changes_no_gradient(aggregation) -> None:
    config = UpdateConfig(
        world_size=1,
        **{**CONFIG, "mini_batches": 1, "aggregation": aggregation},
        kl_in_loss_coef=0.1,
        entropy_coef=0.01,
    )
    batch = episode_batch()
    environment = batch.observation_mask.bool()
    assert environment.sum() > 0
    changed = replace(
        batch,
        old_logprobs=torch.where(environment, batch.old_logprobs + 5.0, batch.old_logprobs),
        ref_logprobs=torch.where(environment, batch.ref_logprobs - 3.0, batch.ref_logprobs),
        advantages=torch.where(environment, -7.0 * batch.advantages - 1.0, batch.advantages),
    )
    reference = updated_weights(batch, config)
    after_change = updated_weights(changed, config)
    assert all(torch.equal(reference[name], after_change[name]) for name in reference)
    # a change on the model's own tokens does move the update: the check can fail
    model_tokens = batch.response_mask.bool()
    control = replace(batch, advantages=torch.where(model_tokens, batch.advantages + 1.0, batch.advantages))
    after_control = updated_weights(control, config)
    assert not all(torch.equal(reference[name], after_control[name]) for name in reference)
