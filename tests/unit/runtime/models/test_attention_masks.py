"""A trainer attends by its own masks (models/attention_masks.py): a 4D mask for rows with padding, none for a pass
without any. Its log-probs must be those of the same model attending by transformers' own masks."""

import copy

import pytest
import torch
from torch.testing import assert_close

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.algorithms.losses import logprobs_from_logits
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.fsdp import FSDPTrainer, position_ids
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, P, make_batch, tiny_model


def without_padding(batch: RolloutBatch) -> RolloutBatch:
    batch.prompt_mask = torch.ones_like(batch.prompt_mask)
    batch.response_mask = torch.ones_like(batch.response_mask)
    return batch


def transformers_logprobs(model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """(N, R) log-probs of the response tokens, the model under plain SDPA given the 2D padding mask."""
    mask = batch.attention_mask
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    return logprobs_from_logits(logits[:, P - 1 : -1].float(), batch.response_ids)  # (N, R)


@pytest.mark.parametrize("micro", [1, 4])
@pytest.mark.parametrize("padding", ["padded", "no padding"])
def test_the_trainers_masks_score_as_transformers_masks_do(padding: str, micro: int) -> None:
    """Micro-batches of 1 row put the batch's one row without padding (row 0) in a pass of its own, among padded
    passes; `no padding` has none at all."""
    model = tiny_model()
    theirs = copy.deepcopy(model)
    trainer = FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)
    assert trainer.builds_own_mask and trainer.causal_when_unpadded
    batch = make_batch() if padding == "padded" else without_padding(make_batch())
    ours = trainer.logprobs(forward_input(batch), 1.0, micro)
    valid = batch.response_mask.bool()
    assert_close(ours[valid], transformers_logprobs(theirs, batch)[valid], rtol=1e-5, atol=1e-5)


def test_the_model_attends_by_transformers_masks_outside_the_trainers_forward() -> None:
    """Only the trainer's own unpadded forwards run without a mask: called by anyone else with a 2D padding mask,
    the model handed to a trainer still attends by it."""
    model = tiny_model()
    theirs = copy.deepcopy(model)
    trainer = FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)
    batch = without_padding(make_batch())
    trainer.logprobs(forward_input(batch), 1.0, 4)  # an unpadded forward of the trainer's
    padded = make_batch()
    assert model.config._attn_implementation == "sdpa"
    assert_close(transformers_logprobs(model, padded), transformers_logprobs(theirs, padded), rtol=0, atol=0)


def test_an_unpadded_update_under_gradient_checkpointing_equals_one_without() -> None:
    """Gradient checkpointing runs each layer's forward again in the backward, after the trainer's forward has
    left `own_sdpa`: the layer must attend the same way then (no mask, causal), or the gradients differ."""
    weights = []
    for checkpointing in (False, True):
        trainer = FSDPTrainer(
            tiny_model(), world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-2), total_steps=1,
            gradient_checkpointing=checkpointing,
        )  # fmt: skip
        trainer.model.train()
        update_policy(trainer, without_padding(make_batch()), UpdateConfig(world_size=1, **CONFIG))
        weights.append({name: param.detach().clone() for name, param in trainer.model.named_parameters()})
    moved = max(float((weights[0][name] - tiny_model().state_dict()[name]).abs().max()) for name in weights[0])
    assert moved > 1e-3
    for name in weights[0]:
        assert_close(weights[1][name], weights[0][name], rtol=0, atol=1e-6, msg=name)
