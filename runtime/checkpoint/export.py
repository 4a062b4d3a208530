"""A checkpoint's actor as a Hugging Face model folder, ready for vLLM or transformers.

    export_hf("ckpts/step-000100", "/models/base", "runs/job/model")

The model is built from the base model's config (random init, then overwritten), in the dtype
the checkpoint holds, and DCP loads the actor's shards into it in this one process, without a
process group: DCP reshards whatever world size wrote them to a single full copy. Only the
weights are read; the optimizer state in the same files is left on disk. The folder is written
beside its target and renamed into place, so a crash never leaves a half model that looks whole.
"""

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from kuberl.runtime.checkpoint.state import dcp_reader, restore_tied, tied_aliases
from kuberl.runtime.checkpoint.storage import Location

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # state.py saves {"model": <model state dict>, "optimizer": ...}


def checkpoint_dtype(metadata: Metadata) -> torch.dtype:
    """The dtype of the saved weights (of the first one: a trained model has one dtype)."""
    for key, item in sorted(metadata.state_dict_metadata.items()):
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            return item.properties.dtype
    raise ValueError("the checkpoint holds no model weights (no tensor under 'model.')")


def export_hf(
    checkpoint_dir: str, base_model_path: str, out_dir: str, name: str = "actor", tokenizer_path: str | None = None
) -> Path:
    """Write <checkpoint_dir>/<name> as a Hugging Face causal-LM folder at out_dir; returns out_dir.

    The tokenizer comes from `tokenizer_path` (spec.models.actor.tokenizer), else from the base model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    source = Location(checkpoint_dir).child(name)
    reader = dcp_reader(source.uri)
    metadata = reader.read_metadata()
    if any(".lora_A." in key for key in metadata.state_dict_metadata):
        raise ValueError(
            f"{source.uri} holds LoRA adapters (spec.models.actor.lora), not a whole model; the run exports the "
            "adapter to <output>/model (and, with lora.exportMerged, the merged model to <output>/model-merged)"
        )
    dtype = checkpoint_dtype(metadata)
    config = AutoConfig.from_pretrained(base_model_path)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    aliases = tied_aliases(model)
    state = {"model": {key: tensor for key, tensor in model.state_dict().items() if key not in aliases}}
    dcp_load(state, storage_reader=dcp_reader(source.uri), no_dist=True)
    model.load_state_dict(restore_tied(model, state["model"]), strict=True)

    target = Path(out_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        _copy_tokenizer(base_model_path, tokenizer_path or base_model_path, staging)
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("exported %s as a Hugging Face model: %s", source.uri, target)
    return target


def _copy_tokenizer(base_model_path: str, tokenizer_path: str, folder: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    try:
        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(folder)
    except (OSError, ValueError) as error:
        log.warning("export: %s has no loadable tokenizer (%s); the exported folder has none", tokenizer_path, error)
    try:
        GenerationConfig.from_pretrained(base_model_path).save_pretrained(folder)
    except OSError:
        pass  # no generation_config.json in the base model: save_pretrained wrote the default one
