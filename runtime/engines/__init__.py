"""Engines: the FSDP2 trainer and the rollout engines behind `RolloutEngine`."""

from typing import Any

import torch

from kuberl.api import RLJobSpec, RolloutEngine


def build_rollout_engine(spec: RLJobSpec, model_path: str, tokenizer: Any, device: torch.device) -> Any:
    """The engine `spec.rollout.engine` names, holding the model at `model_path`."""
    if spec.rollout.engine == RolloutEngine.HF:
        from transformers import AutoModelForCausalLM

        from kuberl.runtime.engines.hf import HFRolloutEngine

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        return HFRolloutEngine(torch.nn.Module.to(model, device), tokenizer, device)
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    return VLLMRolloutEngine.create(spec, model_path, device)
