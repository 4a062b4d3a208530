"""LoRA's pure parts (`runtime/models/lora.py`, `engines/vllm_lora.py`): names, payloads, the merge, the checks."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from kuberl.api import LoRASpec, parse_rljob
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.inputs import ForwardInput
from kuberl.runtime.engines.vllm_lora import max_lora_rank_for
from kuberl.runtime.models.lora import (
    adapter_name,
    adapter_weights,
    apply_lora,
    base_name,
    layer_group,
    lora_problems,
    merged_weights,
    sync_mode,
    sync_payload,
    target_modules,
)
from kuberl.runtime.models.tiny import build_tiny_model

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("demo", tmp_path_factory.mktemp("tiny") / "demo")


def job_spec(manifest: dict, lora: dict | None, engine: str = "vllm"):
    manifest["spec"]["models"]["actor"]["lora"] = lora
    manifest["spec"]["rollout"] = {"engine": engine}
    return parse_rljob(manifest).spec


def test_names_map_between_peft_a_saved_adapter_and_the_base_model() -> None:
    assert adapter_name(Q_A) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert base_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )
    assert base_name("base_model.model.model.norm.weight") == "model.norm.weight"
    assert layer_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp"
    assert layer_group("lm_head.weight") == ""


def test_all_linear_resolves_to_the_decoder_layers_and_train_head_adds_the_head(demo_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(demo_dir)
    decoder = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert target_modules(LoRASpec(), model) == decoder
    assert target_modules(LoRASpec(train_head=True), model) == [*decoder, "lm_head"]
    assert target_modules(LoRASpec(target_modules=["q_proj", "v_proj"])) == ["q_proj", "v_proj"]


def test_sync_mode_follows_the_spec(minimal_manifest: dict) -> None:
    assert sync_mode(job_spec(minimal_manifest, None)) is None
    assert sync_mode(job_spec(minimal_manifest, {})) == "adapter"
    assert sync_mode(job_spec(minimal_manifest, {"sync": "merged"}, engine="hf")) == "merged"


def test_vllm_max_lora_rank_is_the_smallest_allowed_that_fits() -> None:
    assert [max_lora_rank_for(r) for r in (1, 4, 8, 9, 320, 512)] == [1, 8, 8, 16, 320, 512]


def test_a_head_adapter_synced_merged_into_a_tied_head_is_refused_naming_the_field(minimal_manifest, demo_dir) -> None:
    spec = job_spec(minimal_manifest, {"trainHead": True, "sync": "merged"})
    assert "spec.models.actor.lora.trainHead" in lora_problems(spec, str(demo_dir))[0]
    assert lora_problems(job_spec(minimal_manifest, {"trainHead": True, "exportMerged": True}), str(demo_dir)) == []
    assert lora_problems(job_spec(minimal_manifest, {"trainHead": True}), str(demo_dir)) == []


def test_unknown_target_modules_fail_naming_the_field(demo_dir: Path) -> None:
    with pytest.raises(ValueError, match="spec.models.actor.lora.targetModules"):
        apply_lora(AutoModelForCausalLM.from_pretrained(demo_dir), LoRASpec(target_modules=["no_such_layer"]))


def test_merged_weights_add_the_scaled_low_rank_product_once_all_parts_arrived() -> None:
    # W = 0, A = [[1, 2]], B = [[1], [3]], scaling 0.5: W + 0.5 * B @ A = [[0.5, 1], [1.5, 3]]
    stream = [
        ("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight", torch.zeros(2, 2)),
        ("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight", torch.tensor([[1.0, 2.0]])),
        ("base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight", torch.tensor([[1.0], [3.0]])),
        ("base_model.model.model.layers.0.mlp.gate_proj.weight", torch.ones(2, 2)),
    ]
    merged = dict(merged_weights(stream, {"model.layers.0.mlp.up_proj": 0.5}))
    torch.testing.assert_close(merged["model.layers.0.mlp.up_proj.weight"], torch.tensor([[0.5, 1.0], [1.5, 3.0]]))
    assert list(merged) == ["model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_proj.weight"]
    with pytest.raises(RuntimeError, match="missing a part"):
        list(merged_weights(stream[:2], {"model.layers.0.mlp.up_proj": 0.5}))


def trained(lora: LoRASpec, demo_dir: Path) -> FSDPTrainer:
    """A single-rank trainer of the demo with `lora` whose adapters look trained (a fresh one has B = 0)."""
    model = apply_lora(AutoModelForCausalLM.from_pretrained(demo_dir), lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.1)
    return FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=None, total_steps=1)


def test_adapter_payload_is_every_adapter_and_nothing_else(demo_dir: Path) -> None:
    trainer = trained(LoRASpec(rank=4, train_head=True), demo_dir)
    adapter = dict(sync_payload(trainer, "adapter"))
    expected = dict(adapter_weights(trainer.model.named_parameters()))
    assert list(adapter) == list(expected) and all(torch.equal(adapter[name], expected[name]) for name in adapter)
    assert len(adapter) == 2 * (4 * 7 + 1) and "base_model.model.lm_head.lora_B.weight" in adapter


def test_merged_payload_loaded_into_the_base_model_scores_as_base_plus_adapter(demo_dir: Path) -> None:
    trainer = trained(LoRASpec(rank=4), demo_dir)
    merged = dict(sync_payload(trainer, "merged"))
    assert "model.embed_tokens.weight" not in merged and "model.norm.weight" not in merged  # untouched blocks
    assert len(merged) == 4 * 7  # every linear layer of the 4 decoder blocks
    plain = AutoModelForCausalLM.from_pretrained(demo_dir)
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert not unexpected
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    batch = ForwardInput(ids, torch.ones_like(ids), ids[:, 4:], 4)
    with torch.no_grad():
        expected = plain(input_ids=ids).logits[0, 3:-1].log_softmax(-1).gather(-1, ids[0, 4:, None]).squeeze(-1)
    torch.testing.assert_close(trainer.logprobs(batch, 1.0, 8)[0], expected, atol=1e-5, rtol=0)


def test_reference_is_the_base_model_with_the_adapters_off(demo_dir: Path) -> None:
    trainer = trained(LoRASpec(rank=4, train_head=True), demo_dir)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    batch = ForwardInput(ids, torch.ones_like(ids), ids[:, 3:], 3)
    base = AutoModelForCausalLM.from_pretrained(demo_dir)
    with torch.no_grad():
        expected = base(input_ids=ids).logits[0, 2:-1].log_softmax(-1).gather(-1, ids[0, 3:, None]).squeeze(-1)
    torch.testing.assert_close(trainer.logprobs(batch, 1.0, 8, base_only=True)[0], expected, atol=1e-6, rtol=0)
    assert (trainer.logprobs(batch, 1.0, 8)[0] - expected).abs().max() > 1e-3  # the adapter is on otherwise


def test_rank_alpha_and_dropout_reach_the_adapters(demo_dir: Path) -> None:
    from kuberl.runtime.models.lora import lora_scalings

    model = apply_lora(AutoModelForCausalLM.from_pretrained(demo_dir), LoRASpec(rank=2, alpha=8, dropout=0.5))
    a = dict(model.named_parameters())["base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight"]
    assert a.shape == (2, 128)  # rank x hidden
    assert set(lora_scalings(model).values()) == {4.0}  # alpha / rank
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.1)
        ids = torch.tensor([[5, 6, 7, 8]])
        model.train()  # dropout on the adapters' input: two passes differ
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
        model.eval()
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_the_exported_adapter_names_its_base_model_as_the_manifest_does_and_a_reader_elsewhere_loads_it(
    demo_dir: Path, tmp_path: Path
) -> None:
    import json

    from peft import PeftModel

    from kuberl.runtime.models.lora import save_adapter
    from kuberl.runtime.models.resolve import ModelLocation

    lora = LoRASpec(rank=4)
    trainer = trained(lora, demo_dir)
    adapter = [(name, t.detach().clone()) for name, t in sync_payload(trainer, "adapter")]
    # demo_dir is this pod's copy of tiny://demo, which exists on no other pod
    save_adapter(adapter, lora, str(demo_dir), str(tmp_path / "model"), None, "tiny://demo")
    recorded = json.loads((tmp_path / "model" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == "tiny://demo"

    # a reader on another machine: its own cache, the base resolved from the name the adapter records
    base = ModelLocation(recorded, "adapter_config.json").resolve(tmp_path / "reader-cache")
    assert base != demo_dir
    reader = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "model")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    batch = ForwardInput(ids, torch.ones_like(ids), ids[:, 3:], 3)
    with torch.no_grad():
        read = reader(input_ids=ids).logits[0, 2:-1].log_softmax(-1).gather(-1, ids[0, 3:, None]).squeeze(-1)
    torch.testing.assert_close(read, trainer.logprobs(batch, 1.0, 8)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("location", "recorded"),
    [
        ("hf://Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),  # the hub id PEFT and transformers load
        ("file:///models/qwen", "/models/qwen"),
        ("/models/qwen", "/models/qwen"),
        ("s3://bucket/models/qwen", "s3://bucket/models/qwen"),
        ("tiny://counter", "tiny://counter"),
    ],
)
def test_the_base_model_is_recorded_as_a_location_a_reader_can_resolve(location: str, recorded: str) -> None:
    from kuberl.runtime.models.lora import base_model_name

    assert base_model_name(location) == recorded
