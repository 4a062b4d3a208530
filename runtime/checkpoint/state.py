"""The ranks' side of a checkpoint: one trainer's weights, optimizer, LR schedule and RNG.

Weights and optimizer state are written with torch.distributed.checkpoint (DCP) from the FSDP2
model's sharded state dict (`get_state_dict`): every rank writes its own shards, and DCP's
metadata records each shard's global offsets, so a checkpoint written by N ranks loads into any
other number of ranks (and into one process without a process group: export.py).

With LoRA (`spec.models.actor.lora`) the frozen base weights are left out: the shards hold the
adapters, their optimizer state and, with trainHead, the head.

Beside the shards each rank writes `rank-<r>.pt`: the LR scheduler's state (the same on every
rank) and that rank's RNG states (torch, CUDA, numpy, python). A resume with a different world
size gives rank r the RNG of saved rank r % saved_world_size.

    <location>/<name>/.metadata, __<r>_0.distcp ...   DCP: {"model": ..., "optimizer": ...}
    <location>/<name>/rank-00000.pt ...               {"scheduler": ..., "rng": ...}

Both functions are collectives when a process group is up: every rank must call them.
"""

import io
import random
import re
from typing import Any, Protocol

import numpy as np
import torch
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter  # no public alias yet
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from kuberl.runtime.checkpoint.storage import Location, is_remote, storage_options
from kuberl.runtime.checkpoint.store import CheckpointError

RANK_FILE = re.compile(r"^rank-(\d+)\.pt$")
#: A trained model's checkpoint holds what trains: every weight in a full fine-tune, the adapters (and a
#: trained head) with LoRA, whose frozen base is read again from the model folder at start-up.
TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True)
#: Loading leaves the frozen weights out too; DCP has already refused a checkpoint that lacks a trained one.
LOAD_TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True, strict=False)


class Trainer(Protocol):
    """What a checkpoint needs of a trainer (FSDPTrainer has it)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def dcp_writer(uri: str) -> StorageWriter:
    if is_remote(uri):
        # sync_files would call os.sync() for every object stream; a finished PUT is already durable
        return FsspecWriter(uri, sync_files=False, **storage_options(uri))
    return FileSystemWriter(uri)


def dcp_reader(uri: str) -> StorageReader:
    return FsspecReader(uri, **storage_options(uri)) if is_remote(uri) else FileSystemReader(uri)


def save_trainer_state(trainer: Trainer, location: str, name: str, rank: int) -> None:
    """Write this rank's share of `trainer` under <location>/<name>/ (collective: every rank calls it).

    Save after at least one optimizer step: DCP initialises an empty Adam state by a zero step,
    which would move Adam's step count.
    """
    target = Location(location).child(name)
    if not is_remote(location):
        target.makedirs()
    dcp_save(_sharded_state(trainer), storage_writer=dcp_writer(target.uri))
    extra = {
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "rng": capture_rng(),
    }
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    target.child(rank_file_name(rank)).write_bytes(buffer.getvalue())


def load_trainer_state(trainer: Trainer, location: str, name: str, rank: int) -> None:
    """Load <location>/<name>/ into `trainer`, resharded to this run's world size (collective)."""
    source = Location(location).child(name)
    state = _sharded_state(trainer)
    dcp_load(state, storage_reader=dcp_reader(source.uri))
    restore_tied(trainer.model, state["model"])
    if trainer.optimizer is not None:
        set_state_dict(
            trainer.model,
            trainer.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=LOAD_TRAINED_ONLY,
        )
    else:
        set_model_state_dict(trainer.model, state["model"])
    saved_ranks = sorted(int(m.group(1)) for f in source.files() if (m := RANK_FILE.match(f)))
    if saved_ranks != list(range(len(saved_ranks))) or not saved_ranks:
        raise CheckpointError(f"{source.uri}: rank files {saved_ranks} are not rank-00000.pt .. rank-N.pt")
    extra = torch.load(
        io.BytesIO(source.child(rank_file_name(rank % len(saved_ranks))).read_bytes()), weights_only=True
    )
    if trainer.scheduler is not None and extra["scheduler"] is not None:
        trainer.scheduler.load_state_dict(extra["scheduler"])
    restore_rng(extra["rng"])


def _sharded_state(trainer: Trainer) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...} without the second name of a tied weight (saved once)."""
    state: dict[str, Any]
    if trainer.optimizer is None:
        state = {"model": get_model_state_dict(trainer.model)}
    else:
        model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer, options=TRAINED_ONLY)
        state = {"model": model_state, "optimizer": optim_state}
    for alias in tied_aliases(trainer.model):
        state["model"].pop(alias, None)
    return state


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Second names of shared parameters -> the first name: {"lm_head.weight": "model.embed_tokens.weight"}.

    A state dict lists a tied weight under both names and DCP would write it twice (8% of a
    100M-parameter Qwen2 checkpoint). It is saved under its first name only and put back under
    the others before loading into a model.
    """
    first: dict[int, str] = {}
    aliases = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            aliases[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return aliases


def restore_tied(model: torch.nn.Module, model_state: dict[str, Any]) -> dict[str, Any]:
    for alias, name in tied_aliases(model).items():
        if name in model_state:  # a frozen (LoRA base) weight is not in the checkpoint under either name
            model_state[alias] = model_state[name]
    return model_state


def capture_rng() -> dict[str, Any]:
    """This process's RNG states, as tensors and ints only (loadable with weights_only=True)."""
    bit_generator, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
        "numpy": {
            "bit_generator": bit_generator,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["bit_generator"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
