"""Engines: the FSDP2 trainer and the rollout engines behind `RolloutEngine`."""

from typing import Any

import torch

from kuberl.api import RLJobSpec, RolloutEngine
from kuberl.runtime.models.dtypes import rollout_dtype, torch_dtype
from kuberl.runtime.models.lora import sync_mode


def build_rollout_engine(spec: RLJobSpec, model_path: str, tokenizer: Any, device: torch.device) -> Any:
    """The engine `spec.rollout.engine` names, holding the model at `model_path` in spec.rollout.dtype."""
    if spec.rollout.engine == RolloutEngine.HF:
        from transformers import AutoModelForCausalLM

        from kuberl.runtime.engines.hf import HFRolloutEngine

        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(rollout_dtype(spec)))
        if spec.models.actor.lora is not None and sync_mode(spec) == "adapter":  # the same LoRA layers
            from kuberl.runtime.models.lora import apply_lora

            with torch.random.fork_rng(devices=[]):  # its fresh adapters are overwritten by the first sync
                model = apply_lora(model, spec.models.actor.lora)
        return HFRolloutEngine(torch.nn.Module.to(model, device), tokenizer, device)
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine.create(spec, model_path, device)
