"""LoRA on the actor (`spec.models.actor.lora`): the PEFT wrapping, and what a weight sync sends.

LoRA is a property of the model worker, not a worker of its own (DESIGN.md): the actor trainer
holds a PEFT model, trains its adapters (with `trainHead`, one on the LM head too), and the sync
sends one of three payloads, chosen by `sync_mode` from the spec alone:

- `None` (no LoRA): every parameter, gathered in full (`FSDPTrainer.full_tensors`).
- `"adapter"`: only the adapter tensors, under the names of a saved PEFT adapter
  (`base_model.model.<layer>.lora_A.weight`). The engine generates with the adapter: the hf
  engine holds a PEFT model of its own; vLLM loads the tensors from memory as a LoRA adapter
  (`engines.vllm_lora`). A few megabytes instead of the whole model.
- `"merged"` (`lora.sync: merged`): the blocks the adapters touch, merged (W + (alpha / r) * B @ A),
  under the base model's names, loaded in place like a full sync into an engine that holds the
  plain base model. Larger than an adapter, but generation then runs at the base model's speed
  (vLLM's LoRA layers add a low-rank product to every adapted layer of every token).

The payloads are pure functions over a stream of `(PEFT parameter name, full tensor)` pairs, so
the same code serves one process and FSDP2 ranks (whose stream is a sequence of all-gathers).
How this departs from verl: verl syncs adapters to vLLM the same way (a tensor-carrying
LoRARequest) and merges for engines without adapter loading; kuberl offers both on every engine
and lets the job choose (`lora.sync`). The KL reference of a LoRA actor is the same model with the
adapters switched off (`adapters_off`), as in verl and TRL: no second copy of the weights.
"""

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from kuberl.api import LoRASpec, LoRASync, RLJobSpec

#: The one adapter kuberl trains; PEFT puts its name into parameter names (`lora_A.default.weight`).
ADAPTER = "default"
#: PEFT's prefix before the wrapped model's own parameter names.
PEFT_PREFIX = "base_model.model."
HEAD = "lm_head"
#: The layers PEFT counts as embeddings (peft.utils.constants.EMBEDDING_LAYER_NAMES): an adapter on one makes
#: PEFT save the layer's weights with the adapter.
EMBEDDING_LAYERS = ("embed_tokens", HEAD)


def target_modules(lora: LoRASpec, model: torch.nn.Module | None = None) -> list[str]:
    """The layer names that get adapters. `all-linear` (PEFT's shorthand) is every linear layer but the head,
    resolved against `model` (without one, the names of Llama/Qwen-style decoders); `trainHead` adds the head."""
    names = list(lora.target_modules)
    if "all-linear" in names:
        linear = (
            {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            if model is not None
            else set(DECODER_LINEAR)
        )
        names = sorted((set(names) - {"all-linear"}) | (linear - {HEAD}))
    if lora.train_head and HEAD not in names:
        names.append(HEAD)
    return names


#: The linear layers of a Llama / Qwen2 decoder block.
DECODER_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def peft_config(lora: LoRASpec, model: torch.nn.Module | None = None) -> Any:
    """The PEFT LoraConfig for `spec.models.actor.lora` (on `model`)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target_modules(lora, model),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: torch.nn.Module, lora: LoRASpec) -> torch.nn.Module:
    """`model` wrapped by PEFT: its weights frozen, fresh adapters (B = 0: the model is unchanged) trainable."""
    import warnings

    from peft import get_peft_model

    try:
        with warnings.catch_warnings():
            # PEFT warns that a head adapter on a tied head would change the embeddings when merged;
            # lora_problems refuses those merges at start-up, and unmerged the adapter is exact.
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*", category=UserWarning)
            return get_peft_model(model, peft_config(lora, model))
    except ValueError as error:  # PEFT names the modules it could not find
        raise ValueError(f"spec.models.actor.lora.targetModules: {error}") from error


def peft_config_dict(lora: LoRASpec) -> dict[str, Any]:
    """The adapter_config.json contents of `lora`, as vLLM's PEFTHelper reads them (it reads r, alpha and
    the features; which layers carry adapters it takes from the tensors' names)."""
    config = peft_config(lora).to_dict()
    return {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}


def transformers_model(model: Any) -> Any:
    """The transformers model inside `model`: a PEFT (LoRA) model's base model, else `model` itself."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def model_name(model: Any) -> str:
    """The name of the transformers class inside `model`, for messages: a PEFT model's base's, and not the class
    FSDP2's fully_shard swaps in (`FSDPQwen2ForCausalLM`, a subclass of FSDPModule and the model's own class).

    >>> from torch.distributed.fsdp import FSDPModule
    >>> class Qwen2ForCausalLM(torch.nn.Module): ...
    >>> FSDPQwen2ForCausalLM = type("FSDPQwen2ForCausalLM", (FSDPModule, Qwen2ForCausalLM), {})
    >>> model_name(Qwen2ForCausalLM()), model_name(FSDPQwen2ForCausalLM())
    ('Qwen2ForCausalLM', 'Qwen2ForCausalLM')
    """
    from torch.distributed.fsdp import FSDPModule

    cls = type(transformers_model(model))
    if issubclass(cls, FSDPModule):
        cls = next(base for base in cls.__mro__[1:] if not issubclass(base, FSDPModule))
    return cls.__name__


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """The base model for the length of the block: every LoRA layer skips its adapter.

    Not PEFT's `disable_adapter()`: that also flips `requires_grad` off and on again, and under FSDP2 it
    flips it on whichever parameter objects a unit holds at the moment — the unsharded ones of the root
    unit (which FSDP2 keeps after a forward) — so the head's adapter would come back frozen: no more
    gradients, and left out of checkpoints as a frozen weight.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def sync_mode(spec: RLJobSpec) -> str | None:
    """What a weight sync sends: None (every weight), "adapter" or "merged" (see the module docstring)."""
    lora = spec.models.actor.lora
    return None if lora is None else str(lora.sync)


# -- names --------------------------------------------------------------------------------------------
def is_trainable_name(name: str) -> bool:
    """Whether a PEFT parameter name is an adapter matrix (what LoRA trains)."""
    return f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name


def adapter_name(name: str) -> str:
    """A PEFT parameter name as a saved adapter names it (what vLLM and `PeftModel.from_pretrained` read).

    Example: base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
          -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
    """
    return name.replace(f".lora_A.{ADAPTER}.", ".lora_A.").replace(f".lora_B.{ADAPTER}.", ".lora_B.")


def base_name(name: str) -> str:
    """A PEFT parameter name as the base model names it.

    Example: base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight
          -> model.layers.0.self_attn.q_proj.weight
    """
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def layer_group(hf_name: str) -> str:
    """The block a base parameter belongs to: model.layers.0.self_attn.q_proj.weight -> model.layers.0.self_attn.

    vLLM fuses the linear layers of one block (q/k/v into qkv_proj, gate/up into gate_up_proj) and
    rebuilds a fused layer only from all of its parts, so the merged sync sends whole blocks.
    """
    module = hf_name.rsplit(".", 1)[0]
    return module.rsplit(".", 1)[0] if "." in module else ""


def touched_groups(model: torch.nn.Module) -> set[str]:
    """The blocks that hold an adapter (see `layer_group`)."""
    return {
        layer_group(base_name(name.split(".lora_")[0] + ".weight"))
        for name, _ in model.named_parameters()
        if is_trainable_name(name)
    }


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """Each adapted layer's base name -> its scaling (alpha / r, or alpha / sqrt(r) with rsLoRA)."""
    return {
        base_name(name + ".weight").removesuffix(".weight"): float(module.scaling[ADAPTER])
        for name, module in model.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and ADAPTER in module.scaling
    }


def merged_parameter_wanted(name: str, groups: set[str]) -> bool:
    """Whether the merged sync needs this PEFT parameter: an adapter, or a base tensor in a touched block."""
    return is_trainable_name(name) or layer_group(base_name(name)) in groups


# -- payloads ------------------------------------------------------------------------------------------
def adapter_weights(named: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """The trainable tensors of a stream of PEFT parameters, under their saved-adapter names."""
    for name, tensor in named:
        if is_trainable_name(name):
            yield adapter_name(name), tensor


def merged_weights(named: Iterable[tuple[str, Tensor]], scalings: dict[str, float]) -> Iterator[tuple[str, Tensor]]:
    """Base-model tensors with the adapters merged in: W + scaling * B @ A for each adapted layer.

    `named` streams PEFT parameters in module order (PEFT registers base_layer, then lora_A, then
    lora_B); an adapted layer's merged weight is yielded once its three parts have arrived, every
    other tensor as it comes. Merging runs in fp32 and returns the weight's dtype.
    """
    pending: dict[str, dict[str, Tensor]] = {}
    for name, tensor in named:
        if ".lora_A." in name or ".lora_B." in name:
            layer = base_name(name.split(".lora_")[0] + ".weight").removesuffix(".weight")
            part = "A" if ".lora_A." in name else "B"
        elif ".base_layer.weight" in name and base_name(name).removesuffix(".weight") in scalings:
            layer, part = base_name(name).removesuffix(".weight"), "W"
        else:
            yield base_name(name), tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            weight, lora_a, lora_b = parts["W"], parts["A"], parts["B"]  # (out, in), (r, in), (out, r)
            delta = scalings[layer] * (lora_b.float() @ lora_a.float())  # (out, in)
            yield f"{layer}.weight", (weight.float() + delta).to(weight.dtype)
            del pending[layer]
    if pending:
        raise RuntimeError(f"merged sync: adapted layers missing a part: {sorted(pending)}")


def head_is_tied(model_path: str) -> bool:
    """Whether the model at `model_path` shares one matrix between its embeddings and its LM head."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", False))


def lora_problems(spec: RLJobSpec, actor_path: str) -> list[str]:
    """What stops `spec.models.actor.lora` from running on the model at `actor_path` (empty: nothing)."""
    lora = spec.models.actor.lora
    if lora is None:
        return []
    problems = []
    if lora.train_head and lora.sync == LoRASync.MERGED and head_is_tied(actor_path):
        problems.append(
            "spec.models.actor.lora.trainHead with sync: merged: the model's LM head is its embedding matrix "
            "(tie_word_embeddings), so the merged head cannot be loaded without changing the embeddings; "
            "use sync: adapter (the adapter changes the head's output only), or a model with an untied head"
        )
    return problems


# -- the worker's side ---------------------------------------------------------------------------------
def sync_payload(trainer: Any, mode: str | None) -> Iterator[tuple[str, Tensor]]:
    """What the actor's `trainer` (an FSDPTrainer) sends to an engine under `mode` (`sync_mode`).

    Collective under FSDP2: every rank must consume it to the end.
    """
    if mode is None:
        return trainer.full_tensors()
    if mode == "adapter":
        return adapter_weights(trainer.full_tensors(select=is_trainable_name))
    groups, scalings = touched_groups(trainer.model), lora_scalings(trainer.model)
    return merged_weights(trainer.full_tensors(select=lambda name: merged_parameter_wanted(name, groups)), scalings)


def load_into(engine: Any, mode: str | None, weights: Iterable[tuple[str, Tensor]]) -> int:
    """Hand a `sync_payload` to a rollout engine: an adapter to `load_adapter`, weights to `load_weights`."""
    return engine.load_adapter(weights) if mode == "adapter" else engine.load_weights(weights)


def base_model_name(location: str) -> str:
    """What an exported adapter's `base_model_name_or_path` says: the actor's model as the manifest names it,
    which a reader anywhere can resolve, never the folder one pod resolved it into (rank 0's cache exists on no
    other pod, and goes with it). hf://org/name becomes the hub id PEFT and transformers load; file:// paths
    become plain paths; tiny://, s3://, gs:// and absolute paths stay as written
    (`kuberl.runtime.models.resolve.ModelLocation(name, field).resolve()` fetches or builds them).

    >>> base_model_name("hf://Qwen/Qwen2.5-0.5B"), base_model_name("file:///models/q"), base_model_name("tiny://counter")
    ('Qwen/Qwen2.5-0.5B', '/models/q', 'tiny://counter')
    """
    for plain in ("hf://", "file://"):
        if location.startswith(plain):
            return location.removeprefix(plain)
    return location


def save_adapter(
    weights: Iterable[tuple[str, Tensor]],
    lora: LoRASpec,
    base_path: str,
    directory: str,
    merged_directory: str | None,
    base_location: str,
) -> None:
    """Write the adapter as a PEFT folder (adapter_config.json, adapter_model.safetensors) at `directory`, and
    with `merged_directory` the base model with the adapter merged in as a Hugging Face model folder there.

    `weights`: the adapter tensors under saved-adapter names (`adapter_weights`). `base_path`: this node's copy
    of the base model; `base_location`: the base model as the manifest names it, which adapter_config.json
    records (`base_model_name`).
    """
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path)
    if merged_directory is not None and lora.train_head and head_is_tied(base_path):
        # merging the head's adapter into a head that is the embedding matrix would change the embeddings:
        # the merged model gets a head of its own (vocab x hidden more parameters)
        base.config.tie_word_embeddings = False
        base.config.get_text_config().tie_word_embeddings = False
        base.lm_head.weight = torch.nn.Parameter(base.lm_head.weight.detach().clone())
    with torch.random.fork_rng(devices=[]):
        model = apply_lora(base, lora)
    targets = {adapter_name(name): p for name, p in model.named_parameters() if is_trainable_name(name)}
    received = dict(weights)
    if set(received) != set(targets):
        raise RuntimeError(
            f"export: adapter tensors {sorted(set(received) ^ set(targets))[:5]} do not match the model's adapter"
        )
    with torch.no_grad():
        for name, tensor in received.items():
            targets[name].copy_(tensor)
    peft_model: Any = model  # a PeftModel: its config becomes adapter_config.json and the model card
    config = peft_model.peft_config[ADAPTER]
    config.base_model_name_or_path = base_model_name(base_location)
    # PEFT's default ("auto") would look the base model's config up by that name, on the hub unless it is a local
    # folder, to see whether the vocabulary grew; kuberl never resizes it, so only targeted embeddings are saved.
    embeddings = bool(set(EMBEDDING_LAYERS) & set(config.target_modules))
    peft_model.save_pretrained(directory, save_embedding_layers=embeddings)
    if merged_directory is not None:
        model.merge_and_unload().save_pretrained(merged_directory)  # type: ignore[operator]
