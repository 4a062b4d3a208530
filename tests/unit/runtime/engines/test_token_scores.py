"""What the trainer's forward pass gives of each response token beside its log-prob: the entropy and the sum of the
distribution's squared probabilities, which the token-baseline estimators read (FSDPTrainer.scores)."""

import pytest
import torch
from torch.testing import assert_close

from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.micro_batches import MicroBatching
from tests.integration.runtime.test_fsdp_equivalence import P, make_batch, tiny_model


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "padding-free"])
def test_sum_pi_squared_is_that_of_the_tempered_distribution_at_every_response_token(padding_free: bool) -> None:
    model = tiny_model()
    trainer = FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)
    trainer.padding_free = padding_free
    batch = make_batch()
    scores = trainer.scores(forward_input(batch), 0.7, MicroBatching(3), sum_pi_squared=True)
    with torch.no_grad():  # the whole vocabulary's probabilities, written out
        mask = batch.attention_mask
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions).logits[:, P - 1 : -1]
        expected = (torch.softmax(logits.float() / 0.7, -1) ** 2).sum(-1)  # (N, R)
    valid = batch.response_mask.bool()
    assert scores.sum_pi_squared is not None
    assert_close(scores.sum_pi_squared[valid], expected[valid], rtol=1e-5, atol=1e-6)
    assert_close(scores.logprobs, trainer.logprobs(forward_input(batch), 0.7, 3))  # the same pass's log-probs


def test_the_model_worker_returns_both_from_one_pass_when_asked() -> None:
    from kuberl.runtime.workers.model_worker import ModelWorker

    worker = ModelWorker(rank=0, world_size=1)
    worker.trainers["actor"] = FSDPTrainer(
        tiny_model(), world_size=1, device=torch.device("cpu"), optim=None, total_steps=1
    )
    batch = make_batch()
    logprobs, squares = worker.compute_logprobs(batch, "actor", 1.0, 4, sum_pi_squared=True)
    assert_close(logprobs, worker.compute_logprobs(batch, "actor", 1.0, 4))
    assert squares.shape == logprobs.shape and bool(((squares > 0) & (squares <= 1))[batch.response_mask.bool()].all())
