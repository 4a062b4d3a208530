"""A transformers model's decoder layers: the units FSDP2 shards, and what training.compile compiles.

`compile_decoder_layers` compiles each layer's forward with torch.compile (inductor), as torchtitan compiles its
transformer blocks under FSDP2: the layer's normalisations, rotary embedding, gated MLP and residual adds become a
few fused kernels instead of dozens of launches, and fused kernels keep fewer intermediate tensors for the
backward. Only the forward method is compiled, not the module: the module, its parameters' names (checkpoints,
weight syncs) and everything around its call (FSDP2's gather and reshard hooks, transformers' gradient
checkpointing) stay as they are, and run eagerly around the compiled code.
"""

from typing import Any

import torch

from kuberl.runtime.models.lora import model_name, transformers_model

#: Graphs torch.compile may keep per function before it gives up and runs it eagerly (its own default is 8). All
#: layers of a model share one code object, and so do the models of one class in a process (an actor and its
#: reference): a graph for each kind of pass (with gradients or without, padded or packed, the first shape and
#: then dynamic sizes, a LoRA model's adapters on and off), for each dtype, adds up past 8.
RECOMPILE_LIMIT = 64


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM or token classifier (at `.model.layers`, or under the
    model's base_model_prefix), of a PEFT (LoRA) model's base model too."""
    model = transformers_model(model)  # a PEFT (LoRA) model's layers are the wrapped model's
    backbone = getattr(model, "model", None) or getattr(model, getattr(model, "base_model_prefix", ""), None)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ValueError(f"{model_name(model)}: no decoder layers found at .model.layers")
    return list(layers)


def compile_decoder_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """Compiles the forward of each of `model`'s decoder layers in place (the instance's `forward`, so the
    module's own `__call__`, hooks included, stays eager); returns how many. Sizes become dynamic after the second
    shape a layer sees (torch.compile's automatic dynamic shapes), so a run's varying widths compile twice, not
    at every step, and only the sizes that vary: `dynamic=True` would make the hidden and head sizes symbolic
    too (FlexAttention compiled that way was slower on an H200, bench/README.md)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend)  # type: ignore[method-assign]
    return len(layers)


def compiled_layers(model: torch.nn.Module) -> int:
    """How many of `model`'s decoder layers run a compiled forward (what `compile_decoder_layers` did)."""
    return sum(is_compiled(layer.forward) for layer in decoder_layers(model))


def is_compiled(function: Any) -> bool:
    """Whether `function` is torch.compile's wrapper of a function."""
    return hasattr(function, "_torchdynamo_orig_callable")
