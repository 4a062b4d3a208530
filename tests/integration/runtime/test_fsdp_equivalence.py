"""A 2-rank FSDP2 update (gloo, CPU, fp32) equals a single-process update of the unsharded batch.

The optimiser is plain SGD here: Adam is invariant to the gradients' scale (its first step is
about lr * sign(gradient)), so it would hide the bug this test exists for — gradients averaged
over ranks instead of summed (FSDP2's divide factor is set per FSDP unit; forgetting the
layers halved their gradients). SGD shows that the sharded gradients, their clipping and the
update are exactly those of the unsharded batch.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.algorithms.correction import CorrectionConfig, rollout_correction
from kuberl.runtime.algorithms.losses import PolicyLossConfig, PolicyLossInputs, policy_loss
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.fsdp import FSDPTrainer, position_ids
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from kuberl.runtime.models.layers import compiled_layers
from tests.integration.runtime.rank_pool import RankPool

pytestmark = pytest.mark.integration

N, P, R, VOCAB = 8, 5, 6, 64
VARIANTS = ["logits", "fusedLogProbs", "compile"]
#: grad_clip below every step's gradient norm here (0.09 to 0.22), so each step clips, by the norm over both ranks'
#: shards in the two-rank update (engines/grad_norm.py)
OPTIM = OptimizerSpec(lr=0.5, grad_clip=0.05)


def sgd(parameters) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=OPTIM.lr)


def tiny_model(hidden_size: int = 32) -> torch.nn.Module:
    """A 2-layer Qwen2 with 4 query heads over 2 key-value heads (head dim hidden_size / 4)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config).float()


def make_batch() -> RolloutBatch:
    generator = torch.Generator().manual_seed(1)
    prompt_lengths = torch.tensor([5, 3, 4, 5, 2, 5, 4, 3])
    response_lengths = torch.tensor([6, 2, 4, 1, 6, 3, 5, 6])
    prompt_mask = (torch.arange(P)[None, :] >= (P - prompt_lengths)[:, None]).long()  # left padding
    response_mask = (torch.arange(R)[None, :] < response_lengths[:, None]).float()  # right padding
    return RolloutBatch(
        prompt_ids=torch.randint(1, VOCAB, (N, P), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(1, VOCAB, (N, R), generator=generator) * response_mask.long(),
        response_mask=response_mask,
        group_index=torch.arange(N) // 4,
        old_logprobs=-torch.rand(N, R, generator=generator) * 3 * response_mask,
        advantages=torch.randn(N, R, generator=generator) * response_mask,
    )


CONFIG = dict(
    ppo_epochs=1,
    mini_batches=2,
    micro_batch_size=2,
    temperature=1.0,
    aggregation="seq_mean_token_mean",
    max_response_length=R,
    policy_loss="ppo_clip",
    loss_config=PolicyLossConfig(clip_low=0.2, clip_high=0.2, dual_clip_c=3.0),
)


def layout(batch: RolloutBatch, world: int, minis: int) -> RolloutBatch:
    """As the controller lays rows out: rank r's shard holds its part of each mini-batch in order."""
    mini_rows = len(batch) // minis
    part = mini_rows // world
    return batch.select([m * mini_rows + r * part + i for r in range(world) for m in range(minis) for i in range(part)])


def fsdp_rank(rank: int, world: int, rendezvous: str, out: str, fused: bool = False, compiled: bool = False) -> None:
    import torch.distributed as dist

    from kuberl.runtime.models import scoring_head

    # a rendezvous file, not a port: a port found free can be taken by another process before rank 0 binds it
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    scoring_head.CHUNK_ELEMENTS = 3 * VOCAB  # fused: slices of 3 tokens, so each pass has several
    trainer = FSDPTrainer(
        tiny_model(), world_size=world, device=torch.device("cpu"), optim=OPTIM, total_steps=10,
        fused_log_probs=fused, compile_layers=compiled,
    )  # fmt: skip
    assert (trainer.scoring_head is not None) == fused
    assert compiled_layers(trainer.model) == (2 if compiled else 0)
    trainer.optimizer = sgd(trainer.model.parameters())
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
    shard = layout(make_batch(), world, CONFIG["mini_batches"]).shard(world)[rank]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # this pooled process's so far
    update_policy(trainer, shard, UpdateConfig(world_size=world, **CONFIG))
    if compiled:  # the layers ran compiled code, whole: no graph break split them
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    weights = {name: tensor.clone() for name, tensor in trainer.full_tensors()}
    if rank == 0:
        torch.save(weights, out)
    # Both ranks leave together: a rank that tore down its process group while the other was still
    # saving aborted at exit now and then ("terminate called without an active exception", ~1 in 12).
    dist.barrier()
    dist.destroy_process_group()


def reference_update() -> dict[str, torch.Tensor]:
    """The same PPO update written plainly: whole mini-batches, no sharding, no FSDP."""
    model = tiny_model()
    optimizer = sgd(model.parameters())
    batch = make_batch()
    mini_rows = N // CONFIG["mini_batches"]
    for mini in range(CONFIG["mini_batches"]):
        rows = slice(mini * mini_rows, (mini + 1) * mini_rows)
        mask = torch.cat([batch.prompt_mask[rows], batch.response_mask[rows].long()], 1)
        ids = torch.cat([batch.prompt_ids[rows], batch.response_ids[rows]], 1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[:, P - 1 : -1]
        logprobs = logits.float().log_softmax(-1).gather(-1, batch.response_ids[rows][..., None]).squeeze(-1)
        inputs = PolicyLossInputs(logprobs, batch.old_logprobs[rows], batch.advantages[rows], batch.response_mask[rows])
        loss, _ = policy_loss("ppo_clip", inputs, CONFIG["loss_config"], CONFIG["aggregation"], max_response_length=R)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize("fused, compiled", [(False, False), (True, False), (False, True)], ids=VARIANTS)
def test_two_rank_fsdp_update_equals_single_process_reference(
    tmp_path: Path, rank_pool: RankPool, fused: bool, compiled: bool
):
    """fusedLogProbs: the head scores from its input inside the sharded root's forward, and its weight's gradient
    (the root unit's) is reduced over the ranks like every other. compile: each decoder layer's forward compiled
    (inductor) between FSDP2's gather and reshard hooks, whose gathered weights its backward reads."""
    out = tmp_path / "fsdp.pt"
    rank_pool.run(fsdp_rank, 2, 2, str(tmp_path / "rendezvous"), str(out), fused, compiled)
    sharded = torch.load(out)
    reference = reference_update()
    initial = {name: param.detach() for name, param in tiny_model().named_parameters()}
    assert sharded.keys() == reference.keys()
    moved = max(float((reference[name] - initial[name]).abs().max()) for name in reference)
    assert moved > 1e-3, "the update must actually move the weights for the comparison to mean anything"
    for name in reference:
        torch.testing.assert_close(sharded[name], reference[name], rtol=0, atol=1e-6, msg=name)


#: Decoupled PPO's truncated weight pi_old / pi_engine (the rollout correction of an asynchronous run),
#: at a threshold the engine log-probs below exceed for some tokens, so truncation is exercised too.
CORRECTION = CorrectionConfig(
    importance_sampling="token", is_threshold=1.2, rejection=None, rejection_low=0.5, rejection_high=2.0
)


def on_policy_rank(rank: int, rendezvous: str, out: str) -> None:
    """One rank, one mini-batch: the update with a separate old-log-prob pass, then the on-policy shortcut;
    each without and with the decoupled rollout correction (the controller's whole-batch weights against
    the update's per-micro-batch ones)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    torch.set_num_threads(1)
    config = UpdateConfig(world_size=1, **{**CONFIG, "mini_batches": 1})
    results: dict[str, object] = {}
    for mode in ("separate_pass", "on_policy", "separate_pass_corrected", "on_policy_corrected"):
        trainer = FSDPTrainer(tiny_model(), world_size=1, device=torch.device("cpu"), optim=OPTIM, total_steps=10)
        trainer.optimizer = sgd(trainer.model.parameters())
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
        batch = make_batch()
        noise = torch.randn(N, R, generator=torch.Generator().manual_seed(2)) * 0.3
        batch.engine_logprobs = (trainer.logprobs(forward_input(batch), 1.0, 2) + noise) * batch.response_mask
        corrected = mode.endswith("_corrected")
        if mode.startswith("separate_pass"):  # what the controller runs when the shortcut does not apply
            batch.old_logprobs = trainer.logprobs(forward_input(batch), 1.0, 2) * batch.response_mask
            correction_metrics = {}
            if corrected:
                mask = batch.response_mask
                correction = rollout_correction(batch.old_logprobs, batch.engine_logprobs, mask, CORRECTION)
                batch.is_weights = correction.weights
                correction_metrics = {f"correction/{name}": float(v) for name, v in correction.metrics.items()}
            metrics = {**update_policy(trainer, batch, config), **correction_metrics}
        else:
            batch.old_logprobs = None
            shortcut = replace(config, on_policy=True, on_policy_correction=CORRECTION if corrected else None)
            metrics = update_policy(trainer, batch, shortcut)
        results[mode] = {
            "weights": {name: tensor.clone() for name, tensor in trainer.full_tensors()},
            "old_logprobs": batch.old_logprobs,
            "metrics": metrics,
        }
    torch.save(results, out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def on_policy_results(tmp_path_factory: pytest.TempPathFactory, rank_pool: RankPool) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("on_policy")
    out = folder / "on_policy.pt"
    rank_pool.run(on_policy_rank, 1, str(folder / "rendezvous"), str(out))
    return torch.load(out, weights_only=False)


def assert_same_update(separate: dict, shortcut: dict) -> None:
    # the behaviour log-probs the shortcut hands back are those of the separate pass
    torch.testing.assert_close(shortcut["old_logprobs"], separate["old_logprobs"], rtol=0, atol=1e-5)
    assert shortcut["metrics"]["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    initial = {name: param.detach() for name, param in tiny_model().named_parameters()}
    moved = max(float((separate["weights"][name] - initial[name]).abs().max()) for name in initial)
    assert moved > 1e-3
    for name, tensor in separate["weights"].items():
        torch.testing.assert_close(shortcut["weights"][name], tensor, rtol=0, atol=1e-5, msg=name)


def test_on_policy_update_equals_the_update_with_a_separate_old_logprob_pass(on_policy_results: dict):
    assert_same_update(on_policy_results["separate_pass"], on_policy_results["on_policy"])


def test_on_policy_correction_equals_the_controllers_whole_batch_correction(on_policy_results: dict):
    """Decoupled PPO's pi_old / pi_engine weights from the update's own forward: the same update and metrics."""
    separate, shortcut = on_policy_results["separate_pass_corrected"], on_policy_results["on_policy_corrected"]
    assert_same_update(separate, shortcut)
    plain = on_policy_results["separate_pass"]["weights"]
    assert max(float((separate["weights"][name] - plain[name]).abs().max()) for name in plain) > 1e-4, (
        "the weights must change the update for the comparison to mean anything"
    )
    assert 0 < separate["metrics"]["correction/is_truncated_fraction"] < 1
    for name in ("log_weight_abs_mean", "is_weight_mean", "is_truncated_fraction", "is_truncated_response_fraction"):
        key = f"correction/{name}"
        assert shortcut["metrics"][key] == pytest.approx(separate["metrics"][key], abs=1e-5), key
