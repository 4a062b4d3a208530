"""Device discipline, proven on a machine without a GPU (issue #33).

Every real tensor here is on the CPU, so a batch that never reached the trainer's device trains anyway: the
first GPU run crashed in the first update ("Expected all tensors to be on the same device") while every CPU
test passed. These tests put the trainer somewhere else:

- the losses, KL and corrections get inputs on FakeTensorMode's fake "cuda" device, one of them left on the
  CPU, and must name it;
- the update runs the real FSDPTrainer's forward passes, losses and backward on the **meta** device. Meta is a
  device other than the host's on which autograd runs (FakeTensorMode's "cuda" aborts in backward on a CPU
  build) and where every read of a value raises, as a host sync would stall a GPU: an update that runs there
  moved every input to the trainer's device and read nothing back inside its passes. The trainer double
  (`MetaDeviceTrainer`) is the real trainer moved to meta; it overrides only the optimiser step, which reads
  one verdict on the host, and the host reads, which it counts (meta holds no values to read);
- the backend of the process group and the device of the sampling generator are pure functions;
- the colocated step's engine order (sleep before the trainer's passes, wake: weights, then KV cache) is
  recorded from the real ModelWorker and Controller, with recording doubles for the engine and the groups.
"""

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

from kuberl.runtime.algorithms.correction import CorrectionConfig, rollout_correction
from kuberl.runtime.algorithms.devices import DeviceMismatchError
from kuberl.runtime.algorithms.kl import kl_penalty
from kuberl.runtime.algorithms.losses import PolicyLossInputs, aggregate_loss, value_loss
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.base import EngineAsleepError, SleepState
from kuberl.runtime.engines.fsdp import FSDPTrainer, adamw_implementation, indexed, process_group_backend
from kuberl.runtime.engines.sampling import generator_device
from kuberl.runtime.engines.updates import UpdateConfig, update_critic, update_policy
from kuberl.runtime.models.layers import compile_decoder_layers
from kuberl.runtime.models.loading import VALUE_MODEL
from kuberl.runtime.workers.model_worker import ModelWorker
from tests.unit.runtime.loop.recording import train_one_step
from tests.unit.runtime.models.test_attention_masks import without_padding

META = torch.device("meta")
VOCAB, HIDDEN = 32, 8
ROWS, PROMPT, RESPONSE = 8, 3, 5


# -- the losses name the input that is elsewhere ------------------------------------------------------
def fake_cuda_and_one_on_the_host(names: list[str], on_host: str) -> dict[str, torch.Tensor]:
    """(4, 6) inputs on FakeTensorMode's "cuda" (call it inside the mode), except `on_host`, left on the CPU."""
    return {name: torch.ones(4, 6, device="cpu" if name == on_host else "cuda") for name in names}


POLICY_INPUTS = ["logprobs", "old_logprobs", "advantages", "mask", "is_weights"]


@pytest.mark.parametrize("on_host", POLICY_INPUTS[1:])
def test_the_policy_loss_names_the_input_not_on_the_log_probs_device(on_host: str) -> None:
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(DeviceMismatchError) as raised:
        PolicyLossInputs(**fake_cuda_and_one_on_the_host(POLICY_INPUTS, on_host))
    assert f"{on_host} is on cpu, logprobs on cuda:0" in str(raised.value)


def test_the_kl_names_the_reference_log_probs_left_on_the_host() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(DeviceMismatchError, match="ref_logprobs is on cpu"):
        kl_penalty(**fake_cuda_and_one_on_the_host(["logprobs", "ref_logprobs"], "ref_logprobs"), estimator="k3")


@pytest.mark.parametrize("on_host", ["old_values", "returns", "mask"])
def test_the_value_loss_names_the_critic_target_left_on_the_host(on_host: str) -> None:
    names = ["values", "old_values", "returns", "mask"]
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(DeviceMismatchError, match=f"{on_host} is on cpu"):
        value_loss(**fake_cuda_and_one_on_the_host(names, on_host), clip=0.2, aggregation="token_mean")


def test_the_rollout_correction_and_the_aggregation_name_their_inputs() -> None:
    config = CorrectionConfig("token", 2.0, None, 0.5, 2.0)
    names = ["trainer_logprobs", "engine_logprobs", "mask"]
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(DeviceMismatchError, match="engine_logprobs is on cpu"):
            rollout_correction(**fake_cuda_and_one_on_the_host(names, "engine_logprobs"), config=config)
        with pytest.raises(DeviceMismatchError, match="mask is on cpu"):
            aggregate_loss(**fake_cuda_and_one_on_the_host(["token_loss", "mask"], "mask"), mode="token_mean")


def test_inputs_on_one_device_pass_the_check() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = PolicyLossInputs(**fake_cuda_and_one_on_the_host(POLICY_INPUTS, on_host=""))
        assert kl_penalty(inputs.logprobs, inputs.old_logprobs, "k3").device.type == "cuda"


# -- pure functions: the process group's backend, the generator's device -----------------------------
def test_a_gpu_process_group_carries_gloo_for_host_counts_beside_nccl() -> None:
    assert process_group_backend("cuda") == "cpu:gloo,cuda:nccl"
    assert process_group_backend("cpu") == "gloo"


def test_a_trainer_given_cuda_without_an_index_holds_the_current_gpu(monkeypatch) -> None:
    """A tensor made on "cuda" is on "cuda:0", which torch compares unequal to "cuda": the first GPU run of
    test_gpu.py failed every trainer case on that ("the forward input is on cuda:0, the trainer on cuda")."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert indexed(torch.device("cuda")) == torch.device("cuda", 1)
    assert indexed(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert indexed(torch.device("cpu")) == torch.device("cpu")


def test_an_offloaded_gpu_trainer_steps_with_the_fused_kernel_and_a_cpu_run_with_the_for_loop() -> None:
    assert adamw_implementation("cuda", "cuda")["fused"] and adamw_implementation("cpu", "cuda")["fused"]
    assert adamw_implementation("cpu", "cpu") == {"fused": False, "foreach": False}


def test_sampling_on_a_gpu_draws_from_a_generator_on_that_gpu() -> None:
    assert generator_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert generator_device(torch.device("cpu")) == torch.device("cpu")


# -- the update on another device ---------------------------------------------------------------------
class TinyLM(nn.Module):
    """A causal LM with transformers' call signature whose ops all run on the meta device (transformers' own
    models read their attention mask on the host when they build it, which meta refuses). The model is the
    stand-in here; the trainer around it is the real FSDPTrainer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.lm_head(torch.tanh(self.embed(input_ids))))  # (m, L, V)


class TinyValueModel(nn.Module):
    """A token-value model (no lm_head: the trainer treats it as a critic) made of meta-friendly ops."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.score = nn.Linear(HIDDEN, 1)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.score(torch.tanh(self.embed(input_ids))))  # (m, L, 1)


class MetaDeviceTrainer(FSDPTrainer):
    """A trainer double: the real FSDPTrainer (forward passes, log-probs, entropy, values) on the meta device,
    a stand-in for a GPU. It overrides the optimiser step (the real one reads a skip verdict on the host, and
    meta has no values) and `to_host` (it counts the reads and returns zeros: there is nothing to read)."""

    def __init__(self, model: nn.Module, padding_free: bool = False, fused_log_probs: bool = False) -> None:
        super().__init__(
            model,
            world_size=1,
            device=torch.device("cpu"),
            optim=None,
            total_steps=1,
            fused_log_probs=fused_log_probs,
        )
        self.model, self.device, self.padding_free = self.model.to(META), META, padding_free
        self.host_reads: list[tuple[int, ...]] = []
        self.optimizer_steps = 0

    def optimizer_step(self, loss: Any = None) -> dict[str, Any]:
        grads = [param.grad for param in self.model.parameters() if param.grad is not None]
        assert grads and all(grad.device == META for grad in grads), "backward reached the parameters on meta"
        assert isinstance(loss, torch.Tensor) and loss.device == META, "the mini-batch's loss stays on the device"
        self.optimizer_steps += 1
        self.model.zero_grad(set_to_none=True)
        return {"grad_norm": torch.stack([grad.norm() for grad in grads]).norm(), "lr": 1e-3, "skipped": 0.0}

    def to_host(self, values: torch.Tensor) -> torch.Tensor:
        assert values.device == META
        self.host_reads.append(tuple(values.shape))
        return torch.zeros(values.shape, dtype=values.dtype)


def host_batch(with_critic_targets: bool = False) -> RolloutBatch:
    """A batch on the host, as the controller hands it to a rank: every field a loss may read is set."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2, 3, 5])  # (N,) response tokens per row
    response_mask = (torch.arange(RESPONSE)[None] < lengths[:, None]).float()  # (N, R)

    def noise() -> torch.Tensor:
        return torch.randn(ROWS, RESPONSE, generator=generator) * response_mask  # (N, R)

    batch = RolloutBatch(
        prompt_ids=torch.randint(2, VOCAB, (ROWS, PROMPT), generator=generator),
        prompt_mask=torch.tensor([[0, 1, 1]] * 4 + [[1, 1, 1]] * 4),  # left padding in half the rows
        response_ids=torch.randint(2, VOCAB, (ROWS, RESPONSE), generator=generator),
        response_mask=response_mask,
        group_index=torch.arange(ROWS) // 2,
        engine_logprobs=noise() - 1.0,
        old_logprobs=noise() - 1.0,
        ref_logprobs=noise() - 1.0,
        advantages=noise(),
        scored=torch.ones(ROWS, dtype=torch.bool),
    )
    if with_critic_targets:
        batch.values, batch.returns = noise(), noise()
    return batch


def config(**changes: Any) -> UpdateConfig:
    base: dict[str, Any] = {
        "ppo_epochs": 2,
        "mini_batches": 2,
        "micro_batch_size": 2,
        "world_size": 1,
        "temperature": 0.7,
        "aggregation": "token_mean",
        "max_response_length": RESPONSE,
        "policy_loss": "ppo_clip",
        "kl_in_loss_coef": 0.1,
        "kl_estimator": "k3",
        "entropy_coef": 0.01,
        "value_clip": 0.2,
    }
    return UpdateConfig(**{**base, **changes})


TOKEN_IS = CorrectionConfig("token", 2.0, None, 0.5, 2.0)
UPDATES = {
    "ppo epochs, kl in the loss, entropy": {},
    "padding-free": {"padding_free": True},
    "on-policy with the decoupled correction": {
        "ppo_epochs": 1,
        "mini_batches": 1,
        "on_policy": True,
        "on_policy_correction": TOKEN_IS,
    },
    "bypass rejection": {"bypass_correction": CorrectionConfig("token", 2.0, "token", 0.5, 2.0)},
    "token-budget micro-batches": {"max_tokens_per_micro_batch": 12},
}


@pytest.mark.parametrize("case", UPDATES)
def test_a_policy_update_on_another_device_moves_its_inputs_there_and_reads_the_host_once(case: str) -> None:
    changes = dict(UPDATES[case])
    trainer = MetaDeviceTrainer(TinyLM(), padding_free=changes.pop("padding_free", False))
    cfg = config(**changes)
    batch = host_batch()
    if cfg.on_policy:
        batch.old_logprobs = None
    metrics = update_policy(trainer, batch, cfg)
    assert trainer.optimizer_steps == cfg.ppo_epochs * cfg.mini_batches
    assert {"actor/loss", "actor/kl_loss", "actor/entropy", "actor/clip_fraction", "actor/grad_norm"} <= set(metrics)
    if cfg.on_policy:  # the behaviour log-probs come back once, then the metrics
        assert trainer.host_reads[0] == (ROWS, RESPONSE) and len(trainer.host_reads) == 2
        assert batch.old_logprobs is not None and batch.old_logprobs.device.type == "cpu"
        assert "correction/is_weight_mean" in metrics
    else:  # every pass's results stayed on the device until the update's one read of its metrics
        assert len(trainer.host_reads) == 1 and len(trainer.host_reads[0]) == 1


def test_a_critic_update_on_another_device_moves_its_targets_there() -> None:
    trainer = MetaDeviceTrainer(TinyValueModel())
    metrics = update_critic(trainer, host_batch(with_critic_targets=True), config())
    assert trainer.optimizer_steps == 4 and len(trainer.host_reads) == 1
    assert {"critic/loss", "critic/value_clip_fraction", "critic/grad_norm"} <= set(metrics)


def test_forward_passes_on_another_device_come_back_to_the_host_in_one_read() -> None:
    from kuberl.runtime.engines.inputs import forward_input

    trainer = MetaDeviceTrainer(TinyLM(), padding_free=True)
    logprobs = trainer.logprobs(forward_input(host_batch()), temperature=1.0, micro_batch_size=3)
    assert logprobs.shape == (ROWS, RESPONSE) and logprobs.device.type == "cpu"
    assert trainer.host_reads == [(ROWS, RESPONSE)]  # three passes, one read


def qwen2(critic: bool = False) -> nn.Module:
    """A real transformers Qwen2 (2 layers, grouped-query SDPA attention), as a policy or a value model."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, **VALUE_MODEL,
    )  # fmt: skip
    return Qwen2ForTokenClassification(config) if critic else Qwen2ForCausalLM(config)


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fusedLogProbs"])
@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_a_transformers_model_updates_on_another_device_without_reading_its_mask_on_the_host(
    padding_free: bool, fused: bool
) -> None:
    """Given a padding mask or restarting position ids, transformers asks on the host whether it needs a mask
    (`.all()` in masking_utils): on an H200 that was a wait per pass (#38's GPU test). The trainer hands a real
    Qwen2 the 4D mask itself (models/attention_masks.py), so its update runs on meta, where any read raises. So
    does an update whose head scores the tokens from its input (training.fusedLogProbs)."""
    trainer = MetaDeviceTrainer(qwen2(), padding_free=padding_free, fused_log_probs=fused)
    assert trainer.builds_own_mask and (trainer.scoring_head is not None) == fused
    update_policy(trainer, host_batch(), config())
    assert trainer.optimizer_steps == 4 and len(trainer.host_reads) == 1
    critic = MetaDeviceTrainer(qwen2(critic=True), padding_free=padding_free)
    update_critic(critic, host_batch(with_critic_targets=True), config())
    assert critic.optimizer_steps == 4 and len(critic.host_reads) == 1


@pytest.mark.parametrize("padding_free", [False, True], ids=["padded", "packed"])
def test_compiled_layers_update_on_another_device_without_reading_on_the_host(padding_free: bool) -> None:
    """training.compile: the layers' compiled forwards (traced by dynamo, differentiated by AOT autograd) read
    nothing on the host either; aot_eager, since inductor generates no code for meta."""
    trainer = MetaDeviceTrainer(qwen2(), padding_free=padding_free)
    assert compile_decoder_layers(trainer.model, backend="aot_eager") == 2
    counters.clear()
    update_policy(trainer, host_batch(), config())
    assert trainer.optimizer_steps == 4 and len(trainer.host_reads) == 1
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]


@pytest.fixture
def attention_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each SDPA call of a forward attended by: "causal" (no mask, `is_causal`), "4D mask" or "none"."""
    calls: list[str] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args: Any, attn_mask: Any = None, is_causal: bool = False, **kwargs: Any) -> torch.Tensor:
        calls.append("4D mask" if attn_mask is not None and attn_mask.dim() == 4 else "causal" if is_causal else "none")
        return sdpa(*args, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("critic", [False, True], ids=["policy", "critic"])
def test_a_pass_without_padding_attends_by_the_causal_kernel_without_reading_the_host(
    critic: bool, attention_calls: list[str]
) -> None:
    """No padding, no mask: SDPA's `is_causal` kernel (flash, on a GPU) instead of a kernel that reads a 4D mask.
    The model attends under the trainer's own SDPA name, so transformers does not look at the position ids on
    the host either (find_packed_sequence_indices): the update runs on meta."""
    trainer = MetaDeviceTrainer(qwen2(critic=critic))
    batch = without_padding(host_batch(with_critic_targets=critic))
    (update_critic if critic else update_policy)(trainer, batch, config())
    assert trainer.optimizer_steps == 4 and len(trainer.host_reads) == 1
    assert attention_calls and set(attention_calls) == {"causal"}, attention_calls
    attention_calls.clear()  # and a batch with padding gets the 4D mask at every layer of every pass
    (update_critic if critic else update_policy)(trainer, host_batch(with_critic_targets=critic), config())
    assert attention_calls and set(attention_calls) == {"4D mask"}, attention_calls


@pytest.mark.parametrize("given", ["a padding mask", "no mask"])
def test_a_model_under_transformers_sdpa_reads_the_host_to_build_its_mask(given: str) -> None:
    """The other side of the tests above: under plain SDPA, transformers reads a value to decide on its mask, the
    padding mask's (`.all()`) or, given none and no cache (as a trainer's forward), the position ids' (are they
    packed?), which the meta device refuses. (Were this to pass one day, transformers would need the trainer's
    masks no more.)"""
    model = qwen2().to(META)
    ids, mask = torch.ones(2, 4, dtype=torch.long, device=META), torch.ones(2, 4, dtype=torch.long, device=META)
    with pytest.raises(RuntimeError, match="meta"):
        model(input_ids=ids, attention_mask=mask if given == "a padding mask" else None, use_cache=False)


# -- the colocated step sleeps the engine, and wakes it weights first --------------------------------
class RecordingEngine:
    """An engine double that records what the worker asks of it, in order, and keeps the real SleepState."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sleep_state = SleepState()

    def sleep(self, level: int) -> int:
        self.calls.append(f"sleep level {level}")
        self.sleep_state.fall_asleep()
        return 1 << 30

    def wake_up(self, tags: tuple[str, ...] = SleepState.PARTS) -> None:
        self.calls.append(f"wake {'+'.join(tags)}")
        self.sleep_state.wake(tags)

    def load_weights(self, weights: Any) -> int:
        self.sleep_state.require_awake("load_weights", ("weights",))
        self.calls.append(f"load {len(list(weights))} weights")
        return 0

    def load_adapter(self, weights: Any) -> int:
        self.sleep_state.require_awake("load_adapter", ("weights",))
        self.calls.append("load adapter")
        return 0


@pytest.mark.parametrize(("lora_sync", "level", "load"), [(None, 2, "load 3 weights"), ("adapter", 1, "load adapter")])
def test_the_colocated_engine_sleeps_and_wakes_its_weights_before_the_sync_and_its_cache_after(
    lora_sync: str | None, level: int, load: str
) -> None:
    worker = ModelWorker(rank=0, world_size=1)
    worker.trainers["actor"] = FSDPTrainer(
        TinyLM(), world_size=1, device=torch.device("cpu"), optim=None, total_steps=1
    )
    worker.engine, worker.lora_sync = RecordingEngine(), lora_sync
    assert worker.sleep_engine() == {"engine/sleep_freed_bytes": float(1 << 30)}
    worker.sync_weights()
    assert worker.engine.calls == [f"sleep level {level}", "wake weights", load, "wake kv_cache"]
    assert not worker.engine.sleep_state.asleep


def test_an_engine_asleep_refuses_to_generate_or_take_weights() -> None:
    state = SleepState()
    state.fall_asleep()
    with pytest.raises(EngineAsleepError, match="weights and kv_cache are asleep"):
        state.require_awake("generate")
    state.wake(("weights",))
    state.require_awake("load_weights", ("weights",))
    with pytest.raises(EngineAsleepError, match=r"kv_cache is asleep; wake_up\(\('kv_cache',\)\) first"):
        state.require_awake("generate")


def test_a_colocated_step_puts_the_engine_to_sleep_before_the_trainers_passes_and_wakes_it_in_the_sync() -> None:
    log, metrics = train_one_step(host_batch(), separate_pool=False)
    assert log.index("sleep_engine") == 0 and log.count("sleep_engine") == 1
    assert log.index("sync_weights") > log.index("update_actor")  # the sync wakes it (see the worker's test)
    assert metrics["engine/sleep_freed_bytes"] == 0.0 and "time/sleep" in metrics


def test_a_separate_rollout_pool_never_sleeps() -> None:
    log, metrics = train_one_step(host_batch(), separate_pool=True)
    assert "sleep_engine" not in log and "pool load" in log
    assert "engine/sleep_freed_bytes" not in metrics
