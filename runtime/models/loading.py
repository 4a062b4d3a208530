"""How a trainer's model loads: the model worker's and the GPU bench's one way (`load_trainer_model`).

A critic is transformers' token-classification head, one value per token, without dropout.
`AutoModelForTokenClassification` puts a dropout before its value head, at the config's `classifier_dropout`,
else its `hidden_dropout`, else 0.1: for Qwen2 or Llama configs, which have neither, 0.1. The critic's update
runs in train mode while its values for GAE are computed in eval mode, so with that dropout it regressed values
it never predicted. verl's critic sets the same override. (On a GPU the dropout also draws from CUDA's generator:
the likely cause of the 0.04 by which #38's first GPU run found a critic update apart from the host's.)

On a GPU with training.paddingFree, packed rows attend through a kernel that reads where each row starts
(`packed_attention.attention_implementation`).
"""

from pathlib import Path
from typing import Any

import torch

from kuberl.runtime.models.packed_attention import attention_implementation, head_dim_of

#: A critic's config overrides: `config.update(VALUE_MODEL)`, then `from_pretrained(path, config=config)`
#: (given as keywords, from_pretrained hands the ones a config lacks, like classifier_dropout, to the model).
VALUE_MODEL: dict[str, object] = {"num_labels": 1, "classifier_dropout": 0.0}


def load_trainer_model(
    path: str | Path, dtype: torch.dtype, *, critic: bool, padding_free: bool, device_type: str
) -> Any:
    """The Hugging Face model at `path` for a trainer on `device_type`: a causal LM, or with `critic` a value
    model; in `dtype`, on the host (the trainer moves or shards it)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path)
    if critic:
        config.update(VALUE_MODEL)  # one value per token, no dropout before it
    # transformers' default (SDPA), or on a GPU for packed rows a kernel that reads where each starts
    head_dim = head_dim_of(config) if padding_free and device_type == "cuda" else None
    attention = attention_implementation(device_type, padding_free, head_dim=head_dim)
    kind = AutoModelForTokenClassification if critic else AutoModelForCausalLM
    return kind.from_pretrained(path, config=config, dtype=dtype, attn_implementation=attention)
