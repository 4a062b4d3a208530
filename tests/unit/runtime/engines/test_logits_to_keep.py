"""The trainer runs the LM head only at the positions that predict a response token (`logits_to_keep`), not over the
prompt: its log-probs and its update must be those of the head run everywhere, on padded and packed passes. And at
temperature 1 it makes no scaled copy of the logits."""

import pytest
import torch
from torch.testing import assert_close

from kuberl.api.spec import LoRASpec, OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer, takes_logits_to_keep
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from kuberl.runtime.models.lora import apply_lora
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, P, R, make_batch, tiny_model
from tests.integration.runtime.test_micro_batches import tiny_critic
from tests.unit.runtime.algorithms.test_token_scores import VocabularyOps
from tests.unit.runtime.models.test_attention_masks import transformers_logprobs

LAYOUTS = ["padded", "packed"]


def trainer(keeps_logits: bool, packed: bool, lr: float | None = None) -> FSDPTrainer:
    optim = None if lr is None else OptimizerSpec(lr=lr)
    made = FSDPTrainer(
        tiny_model(), world_size=1, device=torch.device("cpu"), optim=optim, total_steps=1, padding_free=packed
    )
    assert made.keeps_logits  # a transformers causal LM takes logits_to_keep
    made.keeps_logits = keeps_logits  # False: the head over every position, as before
    return made


def head_rows(model: torch.nn.Module) -> list[int]:
    """The positions the LM head is run at, one entry per call."""
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda _, args, out: rows.append(args[0].shape[:-1].numel()))
    return rows


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_head_runs_only_where_a_response_token_is_predicted(layout: str) -> None:
    batch = make_batch()
    packed = layout == "packed"
    rows = {}
    for keeps in (True, False):
        scorer = trainer(keeps, packed)
        rows[keeps] = head_rows(scorer.model)
        scorer.logprobs(forward_input(batch), 1.0, micro_batch_size=len(batch))
    real = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    if packed:  # one packed row of the real tokens; the head at each real position before a response slot
        predicting = int(batch.attention_mask[:, P - 1 : -1].sum())
        assert rows == {True: [predicting], False: [real]}
    else:  # R + 1 positions a row (the last predicts nothing), against all P + R
        assert rows == {True: [len(batch) * (R + 1)], False: [len(batch) * (P + R)]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_probs_and_the_update_equal_those_of_the_head_run_everywhere(layout: str) -> None:
    batch = make_batch()
    valid = batch.response_mask.bool()
    scores, weights = [], []
    for keeps in (True, False):
        learner = trainer(keeps, layout == "packed", lr=1e-2)
        scores.append(learner.logprobs(forward_input(batch), 1.0, micro_batch_size=4)[valid])
        learner.model.train()
        update_policy(learner, make_batch(), UpdateConfig(world_size=1, **CONFIG))
        weights.append({name: param.detach().clone() for name, param in learner.model.named_parameters()})
    assert_close(scores[0], scores[1], rtol=0, atol=1e-6)
    assert_close(scores[0], transformers_logprobs(tiny_model(), batch)[valid], rtol=1e-5, atol=1e-5)
    start = tiny_model().state_dict()
    assert max(float((weights[0][name] - start[name]).abs().max()) for name in weights[0]) > 1e-3  # it learned
    for name in weights[0]:
        assert_close(weights[0][name], weights[1][name], rtol=0, atol=1e-6, msg=name)


def test_which_models_take_logits_to_keep() -> None:
    """A LoRA model hands the argument to its base; a critic has no LM head, and a model whose forward lacks the
    argument gets the head's logits everywhere, as before."""
    assert takes_logits_to_keep(apply_lora(tiny_model(), LoRASpec(rank=2)))
    critic = FSDPTrainer(tiny_critic(), world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)
    assert critic.is_critic and not critic.keeps_logits

    class Plain(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return input_ids

    assert not takes_logits_to_keep(Plain())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scoring_at_temperature_one_makes_no_scaled_copy_of_the_logits(temperature: float) -> None:
    """Dividing by a temperature of 1 would write (and in the backward read) one more fp32 copy of the logits; the
    scores are the same without it."""
    batch = make_batch()
    scorer = trainer(True, packed=False)
    with VocabularyOps(scorer.model.config.vocab_size) as ops:
        scorer.logprobs(forward_input(batch), temperature, micro_batch_size=len(batch))
    divisions = [made for made in ops.made if made[0] == "div"]
    assert bool(divisions) == (temperature != 1.0), ops.made  # at 0.7: the recorder sees a division
