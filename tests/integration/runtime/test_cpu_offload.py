"""CPU offload (models.<role>.offload) changes where FSDP2 keeps the shards, never what an update computes.

Two real gloo ranks train the same batch five times: as usual, and with FSDP2's CPUOffloadPolicy in each of
the layouts offload.perLayer and .gradientsOnDevice make. An offloaded model reports the policy on every FSDP unit
(FSDP2's own per-parameter flag) and keeps its shards, and the optimiser state, in host memory; the losses and the
weights after two AdamW steps equal the non-offloaded run's. On this CPU-only machine the device *is* host
memory, so "in host memory" cannot differ from the non-offloaded run by place alone: FSDP2's flag is what tells the
two apart here, and the equality shows the offloaded path (host copies of shards and gradients, the optimiser
stepping on them) is exact.

The layouts show in what an update does between its passes. Gathered for the step (perLayer: false), the decoder
layers stay gathered whole, and no gradient reaches the (host-side) shards before the step's last pass, which
reduces the gradients kept on the device. Per layer with gradientsOnDevice, the layers are sharded again after
each pass but the gradients wait for the last pass just the same. Per layer (true, or unset on two ranks) and
without offload every pass reduces its own. The offloaded trainer's
checkpoint (DCP, as the job saves it) resumes into a fresh offloaded trainer whose next update equals the
original's.
"""

from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.checkpoint.state import load_trainer_state, save_trainer_state
from kuberl.runtime.engines.fsdp import FSDPTrainer, offloaded_to_cpu
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from kuberl.runtime.models.layers import decoder_layers
from tests.integration.runtime.rank_pool import RankPool
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, layout, make_batch, tiny_model

pytestmark = pytest.mark.integration

WORLD = 2


#: the layouts: (offload.params and .optimizer, offload.perLayer, offload.gradientsOnDevice); unset, two ranks
#: move layer by layer and copy the gradients out at every pass
MODES = {
    "on the device": (False, None, None),
    "offloaded": (True, False, None),
    "offloaded per layer": (True, True, None),
    "offloaded, perLayer unset": (True, None, None),
    "offloaded per layer, gradients on the device": (True, True, True),
}


def trainer_with(offload: bool, per_layer: bool | None = False, gradients_on_device: bool | None = None) -> FSDPTrainer:
    return FSDPTrainer(
        tiny_model(),
        world_size=WORLD,
        device=torch.device("cpu"),
        optim=OptimizerSpec(lr=1e-2),
        total_steps=10,
        offload=offload,
        offload_per_layer=per_layer,
        offload_gradients_on_device=gradients_on_device,
    )


def reduced_at_each_pass(trainer: FSDPTrainer) -> list[int]:
    """Notes, at the start of each pass of an update, how many parameters hold a reduced gradient: a sharded
    DTensor's (a gradient kept unreduced for the step is the gathered parameter's, a plain tensor)."""
    seen: list[int] = []
    before_pass = trainer.before_pass

    def noting(last: bool) -> None:
        seen.append(sum(isinstance(param.grad, DTensor) for param in trainer.model.parameters()))
        before_pass(last=last)

    trainer.before_pass = noting  # type: ignore[method-assign]
    return seen


def gathered_after_a_pass(trainer: FSDPTrainer) -> bool:
    """Whether, between the passes of an optimiser step, the first decoder layer's weights stay gathered whole
    (FSDP2 swaps a unit's parameters for plain tensors while it is unsharded). Runs a first pass's forward and
    backward, as an update's first pass, then drops its gradients."""
    model = trainer.model
    layer = decoder_layers(model)[0]
    trainer.before_pass(last=False)
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    whole = not any(isinstance(param, DTensor) for param in layer.parameters())
    trainer.before_pass(last=True)
    model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()  # the last pass reshards, reduces
    trainer.model.zero_grad(set_to_none=True)
    return whole


def train_rank(rank: int, rendezvous: str, out: str, checkpoints: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results, trainers = {}, {}
    shard = layout(make_batch(), WORLD, CONFIG["mini_batches"]).shard(WORLD)[rank]
    config = UpdateConfig(world_size=WORLD, **{**CONFIG, "micro_batch_size": 1})  # two passes a step
    for mode, (offload, per_layer, gradients_on_device) in MODES.items():
        trainer = trainers[mode] = trainer_with(offload, per_layer, gradients_on_device)
        gathered = gathered_after_a_pass(trainer)
        reduced = reduced_at_each_pass(trainer)
        losses = [update_policy(trainer, shard, config)["actor/loss"] for _ in "12"]
        assert trainer.optimizer is not None
        results[mode] = {
            "policy": offloaded_to_cpu(trainer.model),
            "gathers_per_step": trainer.gathers_per_step,
            "reduces_per_step": trainer.reduces_per_step,
            "gathered_after_a_pass": gathered,
            "reduced": list(reduced),  # a copy: the offloaded trainer trains on below
            "shard_devices": {param.to_local().device.type for param in trainer.model.parameters()},
            "state_devices": {
                value.to_local().device.type
                for state in trainer.optimizer.state.values()
                for value in state.values()
                if hasattr(value, "to_local")
            },
            "losses": losses,
            "weights": {name: tensor.clone() for name, tensor in trainer.full_tensors()},
        }
    trainer = trainers["offloaded"]
    save_trainer_state(trainer, checkpoints, "actor", rank)  # the offloaded one, after two steps
    resumed = trainer_with(offload=True)  # gathered for the step, as the saved one
    load_trainer_state(resumed, checkpoints, "actor", rank)
    for each in (trainer, resumed):  # one more update: its step depends on the weights and AdamW's moments
        update_policy(each, shard, config)
    results["next_weights"] = [
        {name: tensor.clone() for name, tensor in each.full_tensors()} for each in (trainer, resumed)
    ]
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def test_offloaded_fsdp2_keeps_shards_in_host_memory_and_trains_the_same(tmp_path: Path, rank_pool: RankPool):
    out = tmp_path / "offload.pt"
    args = (str(tmp_path / "rendezvous"), str(out), str(tmp_path / "checkpoints"))
    rank_pool.run(train_rank, WORLD, *args)
    results = torch.load(out)
    plain = results["on the device"]
    parameters = len(list(tiny_model().parameters()))
    assert [results[mode]["policy"] for mode in MODES] == [False, True, True, True, True]
    assert [results[mode]["gathers_per_step"] for mode in MODES] == [False, True, False, False, False]
    assert [results[mode]["reduces_per_step"] for mode in MODES] == [False, True, False, False, True]
    # 2 updates of 2 optimiser steps (mini-batches) of 2 passes: at a step's second pass, only the offloads that
    # keep the gradients for the step have reduced none yet
    assert plain["reduced"] == [0, parameters] * 4
    assert results["offloaded"]["reduced"] == [0, 0] * 4
    assert results["offloaded per layer"]["reduced"] == [0, parameters] * 4
    assert results["offloaded, perLayer unset"]["reduced"] == [0, parameters] * 4
    assert results["offloaded per layer, gradients on the device"]["reduced"] == [0, 0] * 4
    # and between the passes only the gathered offload holds its decoder layers' weights whole
    gathered = {mode: results[mode]["gathered_after_a_pass"] for mode in MODES}
    assert gathered == {mode: mode == "offloaded" for mode in MODES}
    initial = {name: param.detach() for name, param in tiny_model().named_parameters()}
    assert max(float((plain["weights"][n] - initial[n]).abs().max()) for n in initial) > 1e-3  # it trained
    for mode in [mode for mode in MODES if mode != "on the device"]:
        offloaded = results[mode]
        assert offloaded["shard_devices"] == {"cpu"}
        assert offloaded["state_devices"] == {"cpu"}  # AdamW's moments (DTensor shards), stepped on the CPU
        assert offloaded["losses"] == pytest.approx(plain["losses"], abs=1e-6)
        for name, tensor in plain["weights"].items():  # per step sums a step's gradients in another order
            torch.testing.assert_close(offloaded["weights"][name], tensor, rtol=0, atol=1e-5, msg=f"{mode}: {name}")
    continued, resumed = results["next_weights"]  # the checkpoint carried the weights and the optimiser state
    for name, tensor in continued.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=1e-7, msg=name)
