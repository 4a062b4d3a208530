"""training.fusedLogProbs: the trainer scores each response token from the LM head's input, a slice of tokens at a
time, inside the model's forward (models/scoring_head.py). Its log-probs, entropies and update must be those of the
logits path, padded and packed, in float32 and under bf16 autocast; no pass makes the logits whole; and a model
whose head cannot score that way is refused with the field's name."""

import pytest
import torch
from torch.testing import assert_close

from kuberl.api.spec import LoRASpec, OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.micro_batches import MicroBatching
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from kuberl.runtime.models import scoring_head
from kuberl.runtime.models.lora import apply_lora
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, VOCAB, make_batch, tiny_model
from tests.integration.runtime.test_micro_batches import tiny_critic
from tests.unit.runtime.algorithms.test_token_scores import VocabularyOps
from tests.unit.runtime.models.test_attention_masks import transformers_logprobs

LAYOUTS = ["padded", "packed"]


def trainer(fused: bool, packed: bool, lr: float | None = None, **kwargs) -> FSDPTrainer:  # noqa: ANN003
    optim = None if lr is None else OptimizerSpec(lr=lr)
    return FSDPTrainer(
        kwargs.pop("model", None) or tiny_model(),
        world_size=1,
        device=torch.device("cpu"),
        optim=optim,
        total_steps=1,
        padding_free=packed,
        fused_log_probs=fused,
        **kwargs,
    )


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_gradients_and_the_update_equal_those_of_the_logits_path(
    layout: str, compute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In slices of 5 tokens, so a pass has several, the last one short. Log-probs with sum_pi^2 (the token
    baselines' forward); the gradient of every weight under a loss of the log-probs and the entropy, weighted per
    token; and an update with an entropy bonus. bf16 is the CPU's autocast, a single GPU rank's mixed precision: the
    same bf16 logits either way, so the same scores, and gradients within bf16's rounding of the logits' gradient
    (the head's own backward rounds the weight's once more, the slices each slice's share)."""
    monkeypatch.setattr(scoring_head, "CHUNK_ELEMENTS", 5 * VOCAB)
    batch = make_batch()
    valid = batch.response_mask.bool()
    weights = torch.randn(2, *valid.shape, generator=torch.Generator().manual_seed(2))
    scores, squares, gradients, entropies = [], [], [], []
    for fused in (True, False):
        learner = trainer(fused, layout == "packed", lr=1e-2, compute_dtype=getattr(torch, compute))
        assert (learner.scoring_head is not None) == fused
        scored = learner.scores(forward_input(batch), 0.7, MicroBatching(4), sum_pi_squared=True)
        assert scored.sum_pi_squared is not None
        scores.append(scored.logprobs[valid])
        squares.append(scored.sum_pi_squared[valid])
        learner.model.train()
        graded = learner.response_scores(learner.on_device(forward_input(batch)), 0.7, entropy=True)
        assert graded.entropy is not None
        ((graded.logprobs * weights[0] + graded.entropy * weights[1]) * valid).sum().backward()
        gradients.append({name: param.grad.clone() for name, param in learner.model.named_parameters()})
        learner.model.zero_grad(set_to_none=True)
        metrics = update_policy(learner, make_batch(), UpdateConfig(world_size=1, **{**CONFIG, "entropy_coef": 0.1}))
        entropies.append(float(metrics["actor/entropy"]))
    atol = 1e-5 if compute == "float32" else 1e-4
    assert_close(scores[0], scores[1], rtol=0, atol=atol)
    assert_close(squares[0], squares[1], rtol=0, atol=atol)
    assert entropies[0] == pytest.approx(entropies[1], abs=atol)
    for name, ours in gradients[0].items():
        theirs = gradients[1][name]
        assert float(theirs.abs().max()) > 0, name  # every weight gets a gradient
        error = float((ours - theirs).abs().max() / theirs.abs().max())
        assert error <= (1e-6 if compute == "float32" else 2**-7), (name, error)  # measured 1.6e-7, 2.4e-3
    if compute == "float32":  # and the logits path is transformers' own
        reference = transformers_logprobs(tiny_model(), batch)  # temperature 1
        ours = trainer(True, layout == "packed").logprobs(forward_input(batch), 1.0, micro_batch_size=4)
        assert_close(ours[valid], reference[valid], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_pass_makes_the_logits_whole(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 4 tokens: no tensor with the vocabulary's columns is larger than one slice, in the log-probs'
    forward or in an update's forward and backward. The logits path makes every scored position's at once. (A
    hidden size of 24: the default's MLP is 64 wide, as wide as the vocabulary, and the recorder would count it.)"""
    monkeypatch.setattr(scoring_head, "CHUNK_ELEMENTS", 4 * VOCAB)
    batch = make_batch()
    largest = {}
    for fused in (True, False):
        learner = trainer(fused, layout == "packed", lr=1e-2, model=tiny_model(hidden_size=24))
        with VocabularyOps(VOCAB) as ops:
            learner.logprobs(forward_input(batch), 0.7, micro_batch_size=4)
            learner.model.train()
            update_policy(learner, make_batch(), UpdateConfig(world_size=1, **CONFIG))
        largest[fused] = max(size for _, _, size in ops.made)
    predicting = batch.attention_mask[:, 4:-1]  # P = 5: positions 4 to L - 2 predict the response tokens
    real = max(int(predicting[rows].sum()) for rows in (slice(0, 4), slice(4, 8)))  # packed: the real ones only
    whole = (4 * (batch.response_ids.shape[1] + 1) if layout == "padded" else real) * VOCAB
    assert largest == {True: 4 * VOCAB, False: whole}


def gemma2() -> torch.nn.Module:
    """A tiny Gemma 2: its forward softcaps the head's logits (tanh(z / 30) * 30) after the head."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    assert config.final_logit_softcapping is not None
    return Gemma2ForCausalLM(config)


def test_a_model_that_changes_its_heads_output_is_refused_at_its_first_pass() -> None:
    """Scores from the head's input would leave Gemma 2's softcapping out: the trainer sees that the forward's
    output is not what the head made, and names the field. Without the field the same model scores."""
    batch = forward_input(make_batch())
    with pytest.raises(ValueError, match=r"training\.fusedLogProbs: Gemma2ForCausalLM's forward changes its LM head"):
        trainer(True, packed=False, model=gemma2()).logprobs(batch, 1.0, micro_batch_size=4)
    assert torch.isfinite(trainer(False, packed=False, model=gemma2()).logprobs(batch, 1.0, micro_batch_size=4)).all()


def test_a_lora_actor_scores_at_its_base_head_and_a_lora_head_is_refused() -> None:
    """LoRA on every linear layer but the head (PEFT's all-linear) scores at the base's plain head, as the logits
    path does; an adapter on the head itself is not a plain linear layer, and the field is named."""
    batch = make_batch()
    valid = batch.response_mask.bool()
    scores = [
        trainer(fused, False, lr=1e-2, model=apply_lora(tiny_model(), LoRASpec(rank=2))).logprobs(
            forward_input(batch), 1.0, micro_batch_size=4
        )[valid]
        for fused in (True, False)
    ]
    assert_close(scores[0], scores[1], rtol=0, atol=1e-5)
    on_head = apply_lora(tiny_model(), LoRASpec(rank=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match=r"training\.fusedLogProbs: .*LM head is a peft\..*, not a plain"):
        trainer(True, False, lr=1e-2, model=on_head)


def test_a_critic_has_no_head_to_score_with_and_trains_as_before() -> None:
    critic = FSDPTrainer(
        tiny_critic(), world_size=1, device=torch.device("cpu"), optim=None, total_steps=1, fused_log_probs=True
    )
    assert critic.is_critic and critic.scoring_head is None
