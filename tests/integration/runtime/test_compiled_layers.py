"""training.compile: each decoder layer's forward compiled by torch.compile (inductor, the C++ code it generates
for the CPU here) trains as the eager model does.

One CPU rank, float32, a 2-layer Qwen2: a compiled trainer and an eager one run the same updates and forward
passes, padded and packed (training.paddingFree), with gradient checkpointing and with LoRA, over batches of two
widths. The log-probs, losses and weights after the updates agree to float32 rounding (inductor orders some sums
differently). The compiled code ran, whole (no graph break split a layer), and the layers shared its graphs: a
handful for all passes and widths, not one per layer or per step, and never the recompile limit, past which
torch.compile would run a layer eagerly without saying so in a way a test sees. The two-rank FSDP2 case is in
test_fsdp_equivalence.py; the speed is measured in bench/compile.py and on a GPU by bench/gpu/run.sh.
"""

from dataclasses import replace

import pytest
import torch

from kuberl.api.spec import LoRASpec
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.updates import UpdateConfig, update_policy
from kuberl.runtime.models.layers import compiled_layers
from tests.integration.runtime.jobs import worker_in_this_process
from tests.integration.runtime.test_fsdp_equivalence import CONFIG, OPTIM, make_batch, sgd, tiny_model

pytestmark = pytest.mark.integration

#: The passes' kinds a run of these trainers compiles: with and without gradients, each at its first shape and
#: then with dynamic sizes (and packed, or with adapters off, once more each): a few graphs, whatever the layers.
MOST_GRAPHS = 8


def narrower(batch: RolloutBatch, width: int) -> RolloutBatch:
    """The batch with its responses cut to `width` columns: another shape for the compiled layers."""
    cut = {name: getattr(batch, name)[:, :width] for name in ("response_ids", "response_mask", "old_logprobs")}
    return replace(batch, **cut, advantages=batch.advantages[:, :width])


def trainer(compiled: bool, **options) -> FSDPTrainer:
    model = tiny_model()
    lora = options.pop("lora", None)
    if lora is not None:
        from kuberl.runtime.models.lora import apply_lora

        model = apply_lora(model, lora)
    made = FSDPTrainer(
        model, world_size=1, device=torch.device("cpu"), optim=OPTIM, total_steps=10, compile_layers=compiled,
        **options,
    )  # fmt: skip
    # SGD, as in test_fsdp_equivalence: Adam's first steps are about lr * sign(gradient), which turns a rounding
    # difference in a gradient near 0 into a whole step
    made.optimizer = sgd([param for param in made.model.parameters() if param.requires_grad])
    made.scheduler = torch.optim.lr_scheduler.LambdaLR(made.optimizer, lambda _: 1.0)
    return made


def run(each: FSDPTrainer) -> dict[str, object]:
    """Two updates of different widths, then the log-probs of both batches without gradients."""
    wide = make_batch()
    thin = narrower(wide, 4)
    config = UpdateConfig(world_size=1, **CONFIG)
    losses = [update_policy(each, batch, config)["actor/loss"] for batch in (wide, thin)]
    logprobs = [each.logprobs(forward_input(batch), 1.0, 4) for batch in (wide, thin)]
    weights = {name: tensor.clone() for name, tensor in each.full_tensors()}
    return {"losses": losses, "logprobs": logprobs, "weights": weights}


@pytest.fixture
def counted():
    """torch.compile's counters from zero, and the recompile limit an error rather than a quiet fall-back."""
    torch._dynamo.utils.counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield torch._dynamo.utils.counters


@pytest.mark.parametrize(
    "options",
    [{}, {"padding_free": True}, {"gradient_checkpointing": True}, {"lora": LoRASpec(rank=4, alpha=8)}],
    ids=["padded", "packed", "gradient checkpointing", "LoRA"],
)
def test_compiled_layers_train_as_the_eager_ones(options: dict, counted) -> None:
    eager, compiled = trainer(False, **options), trainer(True, **options)
    assert (compiled_layers(eager.model), compiled_layers(compiled.model)) == (0, 2)
    expected = run(eager)
    graphs = counted["stats"]["unique_graphs"]
    assert graphs == 0  # the eager trainer compiled nothing
    got = run(compiled)
    assert 1 <= counted["stats"]["unique_graphs"] <= MOST_GRAPHS
    assert not counted["graph_break"], dict(counted["graph_break"])
    assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-7)
    for mine, theirs in zip(got["logprobs"], expected["logprobs"], strict=True):  # type: ignore[call-overload]
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    initial = trainer(False, **options)
    start = {name: tensor for name, tensor in initial.full_tensors()}
    weights: dict = got["weights"]  # type: ignore[assignment]
    assert max(float((expected["weights"][name] - start[name]).abs().max()) for name in start) > 1e-3  # trained
    for name, tensor in expected["weights"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_layers_keep_the_parameter_names_and_the_module() -> None:
    """Only each layer's forward is compiled: checkpoints and weight syncs read the same names, and the layers
    are the model's own modules (FSDP2 shards them and hooks them as it would)."""
    eager, compiled = trainer(False), trainer(True)
    assert [name for name, _ in compiled.full_tensors()] == [name for name, _ in eager.full_tensors()]
    assert compiled.model.state_dict().keys() == eager.model.state_dict().keys()
    assert all(type(layer).__name__ == "Qwen2DecoderLayer" for layer in compiled.model.model.layers)


@pytest.mark.parametrize("compile_layers", [True, False], ids=["training.compile", "eager"])
def test_the_model_worker_compiles_the_layers_of_every_roles_trainer(tmp_path, compile_layers: bool) -> None:
    """spec.training.compile reaches the trainer the model worker builds for each role (the actor, a critic with
    its value head, the frozen reference): each of the demo model's four decoder layers compiled, or none.
    Compiling happens at a layer's first pass, so this builds the trainers and runs none; the passes of compiled
    trainers are above, and on two FSDP2 ranks in test_fsdp_equivalence.py."""
    from kuberl.runtime.models.resolve import ModelLocation
    from kuberl.runtime.models.tiny import build_tiny_model

    worker = worker_in_this_process({"training.compile": compile_layers})
    demo = str(build_tiny_model("demo", tmp_path / "demo"))
    optim = worker.job.spec.models.actor.optim
    trainers = {
        "actor": worker._trainer(ModelLocation(demo, "spec.models.actor.path"), "float32", optim, 10),
        "critic": worker._trainer(ModelLocation(demo, "spec.models.critic.path"), "float32", optim, 10, critic=True),
        "reference": worker._trainer(ModelLocation(demo, "spec.models.reference.path"), "bfloat16", None, 0),
    }
    assert {role: compiled_layers(each.model) for role, each in trainers.items()} == dict.fromkeys(
        trainers, 4 if compile_layers else 0
    )
