"""The driver's side of a checkpoint: folders, the commit protocol, validation and retention.

Layout under the checkpoint uri (a path, a mounted PVC, or s3://bucket/prefix):

    step-000020/                  one committed checkpoint
        actor/ .metadata __0_0.distcp __1_0.distcp rank-00000.pt rank-00001.pt   (state.py, by the ranks)
        critic/ ...
        train_state.json          step, epoch, metrics tail... (whatever the controller passes)
        job.yaml                  the RLJob manifest the run was started with
        COMPLETE                  the marker, written last: step, time, and every file's size (+ sha256)
    step-000030.tmp-1f2e3d4c/     a save in progress (local filesystems), or left by a crash
    latest                        "step-000020": the newest commit, for tools and people
    owner.json                    the RLJob the location belongs to (namespace, name, uid), written before
                                  its first save (checkpointing.py decides whose it is, then claims it)

Commit protocol. `begin(step)` hands out a folder for the ranks to write into; `commit` adds
train_state.json and job.yaml, then the marker, then makes the checkpoint visible:
- local path / PVC: the folder is `step-N.tmp-<random>`, renamed to `step-N` after the marker is
  fsync'd. The rename is the commit; a crash before it leaves only a .tmp- folder.
- object store (no atomic rename): the folder is `step-N` itself and the marker, a single PUT
  written last, is the commit. A folder without one is an unfinished save.
Then `latest` is replaced atomically (tmp + rename locally, one small object on S3) and old
checkpoints beyond `keep_last` are deleted, never the one just committed.

A checkpoint counts only when it validates: marker present and readable, its step matching the
folder, every file it lists present with the listed size, the small files (DCP .metadata,
rank files, train_state.json, job.yaml) matching their sha256. A truncated upload, a crash
mid-save or a hand-deleted .metadata is reported (a warning naming the folder and the reason)
and skipped in favour of the previous checkpoint.

Opening a store changes nothing. What crashed saves left (`remove_unfinished`) is removed only once
the location is known to be the opening job's own (checkpointing.py `start_point`): a job pointed at
another job's location by mistake never touches that job's save in progress.
"""

import hashlib
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from kuberl.runtime.checkpoint.storage import Location

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
TRAIN_STATE = "train_state.json"
JOB_MANIFEST = "job.yaml"
LATEST = "latest"
OWNER = "owner.json"
DCP_METADATA = ".metadata"
FORMAT_VERSION = 1
STEP_FOLDER = re.compile(r"^step-(\d+)$")
TEMPORARY_MARK = ".tmp-"
#: DCP data shards are checked by size only: hashing gigabytes at every start would cost minutes.
UNHASHED_SUFFIX = ".distcp"
NO_MARKER = f"no {MARKER} marker (the save did not finish)"


class CheckpointError(RuntimeError):
    """A save that cannot be committed or a checkpoint that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint: after which step, where, and when."""

    step: int
    uri: str
    time: datetime

    def to_status(self) -> dict[str, Any]:
        """The RLJob's status.lastCheckpoint."""
        return {"step": self.step, "uri": self.uri, "time": self.time.strftime("%Y-%m-%dT%H:%M:%SZ")}


def checkpoint_name(step: int) -> str:
    """Zero-padded so that names sort like steps: step-000020."""
    return f"step-{step:06d}"


class CheckpointStore:
    """All checkpoints of one job at one uri. Opening it changes nothing there (`remove_unfinished` cleans)."""

    def __init__(self, uri: str, keep_last: int) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keepLast must be at least 1, got {keep_last}")
        self.root = Location(uri)
        self.keep_last = keep_last
        self.root.makedirs()

    @property
    def uri(self) -> str:
        return self.root.uri

    # -- saving -------------------------------------------------------------------------------------
    def begin(self, step: int) -> str:
        """A fresh folder for step's save; the ranks write their DCP shards under it (save_trainer_state).

        Saving a step that already has a valid checkpoint is refused (that would delete a commit);
        an invalid one left at that step by an earlier run is removed first.
        """
        final = self.root.child(checkpoint_name(step))
        if final.exists():
            ref, problem = self.inspect(final, step)
            if ref is not None:
                raise CheckpointError(
                    f"{final.uri} already holds a committed checkpoint of step {step}; a run saves each step "
                    "once. Resume from it (checkpoint.resume: true), or point checkpoint.uri at an empty location"
                )
            log.warning("removing unusable checkpoint %s before saving step %d again: %s", final.uri, step, problem)
            final.remove()
        folder = final
        if self.root.renames_atomically:
            folder = self.root.child(f"{checkpoint_name(step)}{TEMPORARY_MARK}{secrets.token_hex(4)}")
        folder.makedirs()
        return folder.uri

    def commit(
        self, location: str, step: int, train_state: dict[str, Any], job_manifest: dict[str, Any]
    ) -> CheckpointRef:
        """Seal what the ranks wrote into `location` (from begin) as the checkpoint of `step`."""
        folder = self._folder_of(location, step)
        states = folder.folders()
        if not states:
            raise CheckpointError(
                f"{folder.uri}: no model state to commit; every rank must call save_trainer_state(...) "
                "for each trained model before commit"
            )
        files = folder.files()
        unfinished = [name for name in states if f"{name}/{DCP_METADATA}" not in files]
        if unfinished:
            raise CheckpointError(f"{folder.uri}: {', '.join(unfinished)} has no DCP {DCP_METADATA}; the save failed")
        if train_state.get("step", step) != step:
            raise CheckpointError(f"train_state['step'] is {train_state['step']} but the checkpoint is of step {step}")
        folder.child(TRAIN_STATE).write_bytes(json.dumps({**train_state, "step": step}, indent=1).encode())
        folder.child(JOB_MANIFEST).write_bytes(yaml.safe_dump(job_manifest, sort_keys=False).encode())
        committed_at = datetime.now(UTC).replace(microsecond=0)
        marker = {
            "format": FORMAT_VERSION,
            "step": step,
            "time": committed_at.isoformat(),
            "states": states,
            "files": {name: self._describe(folder, name, size) for name, size in sorted(folder.files().items())},
        }
        folder.child(MARKER).write_bytes(json.dumps(marker, indent=1).encode())
        final = self.root.child(checkpoint_name(step))
        if self.root.renames_atomically:
            folder.rename(final)
        self.root.child(LATEST).replace_bytes(f"{final.name}\n".encode())
        ref = CheckpointRef(step=step, uri=final.uri, time=committed_at)
        log.info("checkpoint of step %d committed: %s", step, final.uri)
        self.remove_old(step)
        return ref

    def _folder_of(self, location: str, step: int) -> Location:
        name = location.rstrip("/").rsplit("/", 1)[-1]
        folder = self.root.child(name)
        if folder.uri.rstrip("/") != location.rstrip("/") or not name.startswith(checkpoint_name(step)):
            raise CheckpointError(f"{location} is not a folder this store handed out for step {step} (begin)")
        return folder

    @staticmethod
    def _describe(folder: Location, name: str, size: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"size": size}
        if not name.endswith(UNHASHED_SUFFIX):
            entry["sha256"] = hashlib.sha256(folder.child(name).read_bytes()).hexdigest()
        return entry

    # -- finding ------------------------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Location]]:
        """Every step-N folder, committed or not, oldest first."""
        found = [
            (int(match.group(1)), self.root.child(name))
            for name in self.root.folders()
            if (match := STEP_FOLDER.match(name))
        ]
        return sorted(found, key=lambda item: item[0])

    def latest(self) -> CheckpointRef | None:
        """The newest checkpoint that validates; each newer one that does not is logged and skipped."""
        for step, folder in reversed(self.checkpoints()):
            ref, problem = self.inspect(folder, step)
            if ref is not None:
                return ref
            log.warning("skipping checkpoint %s: %s; falling back to the one before it", folder.uri, problem)
        return None

    def inspect(self, folder: Location, step: int) -> tuple[CheckpointRef | None, str | None]:
        """(ref, None) for a valid checkpoint, (None, why not) otherwise."""
        try:
            return self._validate(folder, step), None
        except CheckpointError as error:
            return None, str(error)
        except (OSError, ValueError) as error:  # an unreadable object is a problem of that checkpoint, not of the run
            return None, f"cannot be read: {type(error).__name__}: {error}"

    def _validate(self, folder: Location, step: int) -> CheckpointRef:
        files = folder.files()
        if MARKER not in files:
            raise CheckpointError(NO_MARKER)
        try:
            marker = json.loads(folder.child(MARKER).read_bytes())
            listed: dict[str, dict[str, Any]] = marker["files"]
            states: list[str] = marker["states"]
            committed_at = datetime.fromisoformat(marker["time"])
            marked_step = int(marker["step"])
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"{MARKER} marker is unreadable ({type(error).__name__}: {error})") from error
        if marker.get("format") != FORMAT_VERSION:
            raise CheckpointError(
                f"{MARKER} marker has format {marker.get('format')}, this kuberl reads {FORMAT_VERSION}"
            )
        if marked_step != step:
            raise CheckpointError(f"{MARKER} marker is of step {marked_step}, the folder of step {step}")
        for state in states:
            if f"{state}/{DCP_METADATA}" not in files:
                raise CheckpointError(f"{state}/{DCP_METADATA} is missing")
        for name, entry in listed.items():
            if name not in files:
                raise CheckpointError(f"{name} is missing")
            if files[name] != entry["size"]:
                raise CheckpointError(f"{name} has {files[name]} bytes, the marker says {entry['size']}")
            if "sha256" in entry and hashlib.sha256(folder.child(name).read_bytes()).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"{name} is corrupt (its sha256 differs from the marker's)")
        try:
            json.loads(folder.child(TRAIN_STATE).read_bytes())
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{TRAIN_STATE} is unreadable ({type(error).__name__}: {error})") from error
        return CheckpointRef(step=step, uri=folder.uri, time=committed_at)

    def load_train_state(self, ref: CheckpointRef) -> dict[str, Any]:
        return dict(json.loads(Location(ref.uri).child(TRAIN_STATE).read_bytes()))

    def manifest_of(self, ref: CheckpointRef) -> dict[str, Any]:
        """The RLJob manifest the run that committed `ref` was started with (its job.yaml)."""
        manifest = yaml.safe_load(Location(ref.uri).child(JOB_MANIFEST).read_bytes())
        return manifest if isinstance(manifest, dict) else {}

    def job_of(self, ref: CheckpointRef) -> tuple[str | None, str | None]:
        """(namespace, name) of the RLJob whose run committed `ref` (its job.yaml)."""
        metadata = self.manifest_of(ref).get("metadata") or {}
        return metadata.get("namespace") or None, metadata.get("name") or None

    # -- owning -------------------------------------------------------------------------------------
    def owner(self) -> dict[str, str | None] | None:
        """The record of the RLJob this location belongs to (namespace, name, uid: each None when unknown); None
        where there is none (nothing was saved here yet, or an older kuberl saved the checkpoints)."""
        record = self.root.child(OWNER)
        if not record.exists():
            return None
        try:
            fields = json.loads(record.read_bytes())
            return {key: str(fields[key]) if fields.get(key) else None for key in ("namespace", "name", "uid")}
        except (ValueError, TypeError, AttributeError) as error:
            raise CheckpointError(
                f"{record.uri} is unreadable ({type(error).__name__}: {error}); it names the RLJob whose checkpoints "
                "these are. Remove it only if they are this job's"
            ) from error

    def claim(self, owner: dict[str, str | None]) -> None:
        """Record `owner` (namespace, name, uid) as the RLJob this location belongs to."""
        self.root.child(OWNER).replace_bytes(json.dumps(owner, indent=1).encode())

    # -- cleaning -----------------------------------------------------------------------------------
    def remove_unfinished(self) -> None:
        """Delete what crashed saves left: .tmp- folders, and on object stores step folders without a marker.

        Only for a location known to be this job's (checkpointing.py), before this run saves anything: another
        job's are its saves in progress. A committed checkpoint is never touched here, valid or not.
        """
        for name in self.root.folders():
            folder = self.root.child(name)
            if TEMPORARY_MARK in name:
                log.info("removing unfinished checkpoint %s (left by a crash during a save)", folder.uri)
                folder.remove()
            elif not self.root.renames_atomically and STEP_FOLDER.match(name) and not folder.child(MARKER).exists():
                log.info("removing unfinished checkpoint %s (no %s marker)", folder.uri, MARKER)
                folder.remove()

    def remove_old(self, committed_step: int) -> None:
        """Keep the newest keep_last valid checkpoints up to `committed_step`; delete older valid ones.

        Deletion is conservative: a checkpoint that fails validation for another reason than a missing
        marker (perhaps only a read error now) is left alone, and so is anything newer than the commit.
        """
        kept = 1  # the one just committed
        for step, folder in reversed(self.checkpoints()):
            if step >= committed_step:
                continue
            ref, problem = self.inspect(folder, step)
            if ref is not None and kept < self.keep_last:
                kept += 1
            elif ref is not None or problem == NO_MARKER:
                log.info("removing old checkpoint %s (keepLast %d)", folder.uri, self.keep_last)
                folder.remove()
