"""Checkpoint and resume: DCP shards written by the ranks, committed atomically by the driver.

Driver (the controller):

    store = CheckpointStore(uri, keep_last)               # changes nothing there
    ref = store.latest()                                  # newest valid checkpoint, or None
    store.claim(owner); store.remove_unfinished()         # once it is known to be this job's (checkpointing.py)
    ... ranks: load_trainer_state(trainer, ref.uri, "actor", rank)
    if should_save(step, last_step, last_time, time.monotonic(), spec, final, preemption.requested):
        location = store.begin(step)
        ... ranks: save_trainer_state(trainer, location, "actor", rank)
        ref = store.commit(location, step, train_state, job_manifest)

Modules: store (layout, commit protocol, validation, retention), state (what a rank saves and
loads), storage (local path / PVC vs object store), policy (when to save), preemption (SIGTERM),
export (a checkpoint's actor as a Hugging Face folder).
"""

from kuberl.runtime.checkpoint.export import export_hf
from kuberl.runtime.checkpoint.policy import should_save
from kuberl.runtime.checkpoint.preemption import PreemptionWatcher
from kuberl.runtime.checkpoint.state import load_trainer_state, save_trainer_state
from kuberl.runtime.checkpoint.storage import StorageError
from kuberl.runtime.checkpoint.store import CheckpointError, CheckpointRef, CheckpointStore

__all__ = [
    "CheckpointError",
    "CheckpointRef",
    "CheckpointStore",
    "PreemptionWatcher",
    "StorageError",
    "export_hf",
    "load_trainer_state",
    "save_trainer_state",
    "should_save",
]
