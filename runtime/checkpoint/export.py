"""A checkpoint's actor as a Hugging Face model folder, ready for vLLM or transformers.

    export_hf("ckpts/step-000100", "/models/base", "runs/job/model")
    export_hf("s3://bucket/job/step-000100", "/models/base", "s3://bucket/job/model")

The model is built from the base model's config (random init, then overwritten), in the dtype
the checkpoint holds, and DCP loads the actor's shards into it in this one process, without a
process group: DCP reshards whatever world size wrote them to a single full copy. Only the
weights are read; the optimizer state in the same files is left on disk.

The target is a folder (on a claim, or the local output) or an object-store URI: on a cluster the
model must outlive the pod that writes it. `staged_folder` gives the writer a local folder and then
publishes it, so a crash never leaves a half model that looks whole: locally the folder is written
beside its target and renamed into place; on an object store, which cannot rename, the files that
make a folder a model (config.json, adapter_config.json) are uploaded last, so a reader that finds
them (runtime/models/resolve.py) finds every other file too.
"""

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from kuberl.runtime.checkpoint.state import dcp_reader, restore_tied, tied_aliases
from kuberl.runtime.checkpoint.storage import Location, is_remote

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # state.py saves {"model": <model state dict>, "optimizer": ...}
#: The files whose presence says a folder holds a whole model (or adapter): published last.
COMPLETING_FILES = ("config.json", "adapter_config.json")


def checkpoint_dtype(metadata: Metadata) -> torch.dtype:
    """The dtype of the saved weights (of the first one: a trained model has one dtype)."""
    for key, item in sorted(metadata.state_dict_metadata.items()):
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata):
            return item.properties.dtype
    raise ValueError("the checkpoint holds no model weights (no tensor under 'model.')")


def export_hf(
    checkpoint_dir: str, base_model_path: str, out_dir: str, name: str = "actor", tokenizer_path: str | None = None
) -> str:
    """Write <checkpoint_dir>/<name> as a Hugging Face causal-LM folder at out_dir (a path or an object-store
    URI); returns out_dir.

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

    with staged_folder(out_dir) as staging:
        model.save_pretrained(staging)
        _copy_tokenizer(base_model_path, tokenizer_path or base_model_path, staging)
    log.info("exported %s as a Hugging Face model: %s", source.uri, out_dir)
    return out_dir


@contextmanager
def staged_folder(target: str) -> Iterator[Path]:
    """A local folder to write a model into, published at `target` (a path or an object-store URI), replacing
    what was there, when the block ends without an error; removed either way."""
    if is_remote(target):
        staging = Path(tempfile.mkdtemp(prefix="kuberl-export-"))
    else:  # beside the target, on its filesystem: the rename is then atomic
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{Path(target).name}.tmp-", dir=Path(target).parent))
    try:
        yield staging
        publish_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_folder(staging: Path, target: str) -> None:
    """Replace `target` with the complete local folder `staging`: by a rename (staging beside it), or on an
    object store by an upload whose COMPLETING_FILES go last."""
    if not is_remote(target):
        if Path(target).exists():
            shutil.rmtree(target)
        os.rename(staging, target)
        return
    destination = Location(target)
    destination.remove()
    files = sorted(path for path in staging.rglob("*") if path.is_file())
    for file in sorted(files, key=lambda path: path.name in COMPLETING_FILES):  # stable: the rest keep their order
        destination.fs.put_file(str(file), destination.child(*file.relative_to(staging).parts).path)


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
