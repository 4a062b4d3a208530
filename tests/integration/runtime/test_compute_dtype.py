"""training.computeDtype bfloat16 on CPU: forward passes under autocast, weights and optimiser in fp32.

A single CPU rank keeps the plain module (no process group needed), so this runs in-process.
"""

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from tests.integration.runtime.jobs import worker_in_this_process
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


# -- frozen linear layers held in the compute dtype (fsdp.store_frozen_linears) -------------------------------
def bf16_trainer(model: torch.nn.Module, optim: OptimizerSpec | None, frozen_in_bf16: bool) -> FSDPTrainer:
    return FSDPTrainer(
        model,
        world_size=1,
        device=torch.device("cpu"),
        optim=optim,
        total_steps=10,
        compute_dtype=torch.bfloat16,
        frozen_in_compute_dtype=frozen_in_bf16,
    )


def lora_model() -> torch.nn.Module:
    from kuberl.api.spec import LoRASpec
    from kuberl.runtime.models.lora import apply_lora

    model = apply_lora(tiny_model(), LoRASpec(rank=4, alpha=8))
    for name, param in model.named_parameters():  # B starts at 0: give the adapters a value that shows
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_a_reference_computing_in_bf16_holds_its_linear_layers_in_bf16_and_scores_bit_for_bit_as_before():
    """verl computes its reference in bf16; kuberl did too (autocast) but stored it in fp32. Stored in bf16, its
    linear layers compute the very values autocast computed from fp32, in half the memory."""
    batch = make_batch()
    fwd = forward_input(batch)
    before = bf16_trainer(tiny_model().requires_grad_(False), None, frozen_in_bf16=False)
    reference = bf16_trainer(tiny_model().requires_grad_(False), None, frozen_in_bf16=True)
    linears = {name for name, module in reference.model.named_modules() if isinstance(module, torch.nn.Linear)}
    dtypes = {name: param.dtype for name, param in reference.model.named_parameters()}
    assert {n for n, d in dtypes.items() if d == torch.bfloat16} == {
        f"{n}.weight"
        for n in linears
        if n != "lm_head"  # the tied head is the embedding's matrix: it stays
    } | {f"{n}.bias" for n in linears if "_proj" in n and n.split(".")[-1] in ("q_proj", "k_proj", "v_proj")}
    assert dtypes["model.embed_tokens.weight"] == torch.float32 and reference.frozen_in_compute_dtype
    assert {param.dtype for param in before.model.parameters()} == {torch.float32}
    assert torch.equal(reference.logprobs(fwd, 1.0, 4), before.logprobs(fwd, 1.0, 4))


def test_a_lora_actor_computing_in_bf16_holds_its_frozen_base_in_bf16_and_trains_bit_for_bit_as_before():
    """#38: plain PEFT keeps a LoRA model's frozen base in bf16. The adapters stay fp32 (the optimiser's), and the
    update moves them exactly as it did over an fp32 base; the verifySync probe scores in the weights' precision."""
    config, optim = UpdateConfig(world_size=1, **CONFIG), OptimizerSpec(lr=1e-2)
    before, actor = bf16_trainer(lora_model(), optim, False), bf16_trainer(lora_model(), optim, True)
    params = dict(actor.model.named_parameters())
    assert {p.dtype for n, p in params.items() if "lora_" in n} == {torch.float32}
    assert all(p.dtype == torch.bfloat16 for n, p in params.items() if "base_layer.weight" in n)
    assert {param.dtype for param in before.model.parameters()} == {torch.float32}
    metrics = [update_policy(trainer, make_batch(), config) for trainer in (before, actor)]
    assert metrics[0]["actor/loss"] == metrics[1]["actor/loss"]
    trained = {n: p for n, p in before.model.named_parameters() if p.requires_grad}
    for name, param in actor.model.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, trained[name]), name
    fwd, mask = forward_input(make_batch()), make_batch().response_mask.bool()
    probe = actor.logprobs(fwd, 1.0, 4, full_precision=True)  # no fp32 pass over bf16 weights: it would fail
    assert torch.equal(probe, actor.logprobs(fwd, 1.0, 4)) and bool(probe[mask].lt(0).all())


def lora_rank(rank: int, world: int, rendezvous: str, out: str) -> None:
    """One of `world` FSDP2 ranks training lora_model() in bf16, over a bf16 base, then over an fp32 one (as before):
    FSDP2 gathers a unit whose shards hold two dtypes as bytes. Rank 0 saves both runs' adapters."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    adapters = {}
    for base in ("bf16", "fp32"):
        trainer = FSDPTrainer(
            lora_model(), world_size=world, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-2),
            total_steps=10, compute_dtype=torch.bfloat16, frozen_in_compute_dtype=base == "bf16",
        )  # fmt: skip
        assert trainer.frozen_in_compute_dtype == (base == "bf16")
        shard = make_batch().shard(world)[rank]
        update_policy(trainer, shard, UpdateConfig(world_size=world, **CONFIG))
        adapters[base] = {name: tensor.clone() for name, tensor in trainer.full_tensors() if "lora_" in name}
    if rank == 0:
        torch.save(adapters, out)
    dist.barrier()
    dist.destroy_process_group()


def test_two_fsdp2_ranks_train_a_lora_actor_over_a_bf16_base_as_over_an_fp32_one(rank_pool, tmp_path):
    out = tmp_path / "adapters.pt"
    rank_pool.run(lora_rank, 2, 2, str(tmp_path / "rendezvous"), str(out))
    adapters = torch.load(out)
    assert adapters["bf16"].keys() == adapters["fp32"].keys() and adapters["bf16"]
    initial = {name: param.detach() for name, param in lora_model().named_parameters() if "lora_" in name}
    assert max(float((adapters["bf16"][name] - initial[name]).abs().max()) for name in initial) > 1e-3  # trained
    for name, tensor in adapters["bf16"].items():
        torch.testing.assert_close(tensor, adapters["fp32"][name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("role", "changes", "frozen_in_bf16"),
    [
        ("reference", {}, True),
        ("actor", {"models.actor.lora": {"rank": 4, "alpha": 8}, "rollout.dtype": "bfloat16"}, True),
        # an fp32 engine: the verifySync probe needs the base's fp32 values
        ("actor", {"models.actor.lora": {"rank": 4, "alpha": 8}}, False),
        ("actor", {"rollout.dtype": "bfloat16"}, False),  # nothing frozen
    ],
    ids=["reference", "lora-bf16-engine", "lora-fp32-engine", "full-actor"],
)
def test_the_model_worker_stores_frozen_linears_in_bf16_for_the_roles_that_compute_the_same_with_them(
    tmp_path, role, changes, frozen_in_bf16
):
    from kuberl.runtime.models.resolve import ModelLocation
    from kuberl.runtime.models.tiny import build_tiny_model

    worker = worker_in_this_process({"training.computeDtype": "bfloat16", **changes})
    location = ModelLocation(str(build_tiny_model("demo", tmp_path / "demo")), f"spec.models.{role}.path")
    actor = worker.job.spec.models.actor
    if role == "reference":
        trainer = worker._trainer(location, "float32", None, 0)
    else:
        trainer = worker._trainer(location, "float32", actor.optim, 10, lora=actor.lora)
    assert trainer.frozen_in_compute_dtype == frozen_in_bf16
    linear_dtypes = {m.weight.dtype for m in trainer.model.modules() if isinstance(m, torch.nn.Linear)}
    assert (torch.bfloat16 in linear_dtypes) == frozen_in_bf16
