"""From a model location in a manifest to a local Hugging Face folder, on the node that loads the model.

    tiny://demo            built here (kuberl.runtime.models.tiny) into <cache>/tiny/demo-<builder hash>
    /models/qwen, file://  used where it is: must exist and hold config.json
    hf://org/name          huggingface_hub.snapshot_download into <cache>/hf
    s3://b/p, gs://b/p     copied with fsspec into <cache>/s3/b/p (s3fs / gcsfs must be installed; AWS_ENDPOINT_URL
                           is honoured, runtime/objectstore.py)

Each pod that loads a model resolves it itself, into its own cache (runtime/loop/plan.py sends locations,
never the head's folders). Builds and downloads land in a temporary folder beside their target and
are renamed into place, so a job killed mid-download never leaves a half folder that a later start
would trust. They run under a lock file beside the target (`.NAME.lock`, flock): of the workers on
one node that resolve the same model at once (the ranks of one pod, or a trainer and its colocated
engine), one builds or downloads it and the others wait for it and use its copy, instead of each
fetching the model again. The kernel drops the lock with the process that held it, so a worker
killed mid-download leaves no stale lock behind.

The tiny models' builder (torch, transformers: seconds of imports) is imported only for a tiny:// location,
so what imports this module for `ModelLocation` alone (a reward worker scoring with a function, the
driver) starts without it.
"""

import fcntl
import fnmatch
import hashlib
import logging
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.api.contract import CACHE_ENV

log = logging.getLogger(__name__)

#: A model's files that are not weights: its config, tokenizer, chat template, generation config.
METADATA_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")


class ModelNotFoundError(ValueError):
    """A model location that cannot be used; the message names the spec field, the location and what to do."""


@dataclass(frozen=True)
class ModelLocation:
    """A model as the manifest names it, and the spec field that names it (for errors).

    This, not a local folder, is what travels from the driver to the workers: on a cluster each
    worker is a pod of its own, and a folder in one pod's cache does not exist in another's. Every
    pod that loads the model resolves it on its own node (`resolve`).
    """

    uri: str  # tiny://NAME, hf://ORG/NAME, s3://..., gs://..., or an absolute path (file://)
    field: str  # e.g. spec.models.actor.path

    @classmethod
    def of(cls, path: str, base_dir: Path, field: str) -> "ModelLocation":
        """The location a manifest's `path` names; a relative path is made absolute against the manifest's
        folder `base_dir`, so it names the same folder on every pod that mounts the volume holding it."""
        if "://" not in path and not Path(path).is_absolute():
            path = str((base_dir / path).resolve())
        return cls(path, field)

    def resolve(self, cache_dir: Path | None = None) -> Path:
        """A local folder holding the model on this node (built, downloaded, or used in place), in `cache_dir`
        (default: this process's default_cache_dir())."""
        return resolve_model_path(self.uri, cache_dir or default_cache_dir(), self.field)

    def resolve_metadata(self, cache_dir: Path | None = None) -> Path:
        """A local folder with the model's config and tokenizer, without its weights (resolve_model_metadata)."""
        return resolve_model_metadata(self.uri, cache_dir or default_cache_dir(), self.field)

    def check(self, cache_dir: Path | None = None) -> None:
        """Raises ModelNotFoundError, naming the field, when this location cannot be resolved; fetches no weights
        (the config alone from the hub)."""
        check_model_location(self.uri, cache_dir or default_cache_dir(), self.field)


def default_cache_dir() -> Path:
    """Where models are resolved and built: $KUBERL_CACHE, else ~/.cache/kuberl."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kuberl")


def tiny_model_dir(name: str, cache_dir: Path) -> Path:
    """Where tiny://NAME is cached: keyed by the builder version and the model's shape, so a change rebuilds."""
    from kuberl.runtime.models.tiny import BUILDER_VERSION, TINY_MODELS

    key = hashlib.sha256(f"{BUILDER_VERSION}:{TINY_MODELS[name]!r}".encode()).hexdigest()[:12]
    return cache_dir / "tiny" / f"{name}-{key}"


def _materialise(target: Path, fill: Callable[[Path], object]) -> Path:
    """The complete folder at target: filled, by the one process holding target's lock, in a temporary
    folder beside it that is then renamed into place; processes that waited for the lock find it done."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _node_lock(target):
        if (target / "config.json").is_file():  # another worker filled it while this one waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            fill(staging)
            try:
                os.rename(staging, target)
            except OSError:
                if not (target / "config.json").is_file():
                    raise
                # A process that does not take the lock (an older kuberl) renamed its copy first: keep it.
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


@contextmanager
def _node_lock(target: Path) -> Iterator[None]:
    """An exclusive flock on `.<target name>.lock` beside target, held while the body runs."""
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process on this node to finish %s", target)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _resolve_tiny(name: str, cache_dir: Path, field: str) -> Path:
    from kuberl.runtime.models.tiny import TINY_MODELS, build_tiny_model

    if name not in TINY_MODELS:
        raise ModelNotFoundError(
            f"{field}: unknown tiny model tiny://{name}; known: "
            + ", ".join(f"tiny://{known}" for known in sorted(TINY_MODELS))
        )
    return _materialise(tiny_model_dir(name, cache_dir), lambda staging: build_tiny_model(name, staging))


def _check_tiny(name: str, cache_dir: Path, field: str) -> None:
    from kuberl.runtime.models.tiny import TINY_MODELS

    if name not in TINY_MODELS:
        _resolve_tiny(name, cache_dir, field)  # raises, listing the known names


def _resolve_local(path: str, field: str) -> Path:
    folder = Path(path.removeprefix("file://"))
    if not folder.is_dir():
        raise ModelNotFoundError(
            f"{field}: model folder {folder} does not exist; mount the volume that holds it "
            "(resources.<role>.podTemplate) or use hf://, s3:// or tiny://demo"
        )
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"{field}: {folder} has no config.json, so it is not a Hugging Face model folder; "
            "point at the folder that holds config.json and the weights"
        )
    return folder


def _hub(repo_id: str, field: str) -> Any:
    """The huggingface_hub module, or a ModelNotFoundError saying to install it or mount the model."""
    try:
        import huggingface_hub
    except ImportError as error:
        raise ModelNotFoundError(
            f"{field}: hf://{repo_id} needs huggingface_hub, which is not installed; "
            "install it in the runtime image or mount the model and give its path"
        ) from error
    return huggingface_hub


def _resolve_hub(repo_id: str, cache_dir: Path, field: str, patterns: tuple[str, ...] | None = None) -> Path:
    hub = _hub(repo_id, field)
    wanted = list(patterns) if patterns is not None else None
    try:
        return Path(hub.snapshot_download(repo_id=repo_id, cache_dir=str(cache_dir / "hf"), allow_patterns=wanted))
    except Exception as error:  # network, auth, missing repo: all mean "not from the hub, here"
        raise ModelNotFoundError(
            f"{field}: cannot download hf://{repo_id} ({type(error).__name__}: {error}); the hub is unreachable "
            "or the repository is private or missing. Mount the model on a volume and give its path instead"
        ) from error


def _object_store(uri: str, field: str) -> tuple[Any, str]:
    """The fsspec filesystem of `uri` and the path in it, or a ModelNotFoundError naming what to install."""
    try:
        from kuberl.runtime.objectstore import url_to_fs

        return url_to_fs(uri)
    except ImportError as error:
        package = {"s3": "s3fs", "gs": "gcsfs"}.get(uri.partition("://")[0], "fsspec")
        raise ModelNotFoundError(
            f"{field}: reading {uri} needs {package}, which is not installed; "
            "install it in the runtime image, or mount the model on a volume and give its path"
        ) from error


def _not_a_model(uri: str, field: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"{field}: {uri} holds no config.json; point at a Hugging Face model folder")


def _unreadable(uri: str, field: str, error: Exception) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"{field}: cannot download {uri} ({type(error).__name__}: {error}); check the URI and that "
        "checkpoint.secretRef / spec.secretRefs give credentials for it"
    )


def _resolve_object_store(uri: str, cache_dir: Path, field: str, patterns: tuple[str, ...] | None = None) -> Path:
    """The folder at `uri` copied into `cache_dir`; with `patterns`, only the files whose names match them."""
    scheme, _, key = uri.partition("://")
    filesystem, root = _object_store(uri, field)
    root = root.rstrip("/") + "/"

    def download(staging: Path) -> None:
        if patterns is None:
            filesystem.get(root, str(staging), recursive=True)
        else:
            for remote in filesystem.find(root):
                relative = remote[len(root) :]
                if any(fnmatch.fnmatch(posixpath.basename(relative), pattern) for pattern in patterns):
                    (staging / relative).parent.mkdir(parents=True, exist_ok=True)
                    filesystem.get_file(remote, str(staging / relative))
        if not (staging / "config.json").is_file():
            raise _not_a_model(uri, field)

    try:
        return _materialise(cache_dir / scheme / key.strip("/"), download)
    except ModelNotFoundError:
        raise
    except Exception as error:  # credentials, missing bucket, network
        raise _unreadable(uri, field, error) from error


def check_model_location(path: str, cache_dir: Path, field: str) -> None:
    """What `resolve_model_path` would refuse, refused without building or downloading the model."""
    if path.startswith("tiny://"):
        _check_tiny(path.removeprefix("tiny://"), cache_dir, field)
    elif path.startswith("hf://"):
        _check_hub(path.removeprefix("hf://"), cache_dir, field)
    elif path.startswith(("s3://", "gs://")):
        _check_object_store(path, field)
    else:
        _resolve_local(path, field)


def _check_hub(repo_id: str, cache_dir: Path, field: str) -> None:
    hub = _hub(repo_id, field)
    try:
        hub.hf_hub_download(repo_id=repo_id, filename="config.json", cache_dir=str(cache_dir / "hf"))
    except Exception as error:  # network, auth, missing repo or file
        raise ModelNotFoundError(
            f"{field}: cannot read hf://{repo_id}/config.json ({type(error).__name__}: {error}); the hub is "
            "unreachable or the repository is private, missing or not a model. Mount the model on a volume "
            "and give its path instead"
        ) from error


def _check_object_store(uri: str, field: str) -> None:
    filesystem, root = _object_store(uri, field)
    try:
        found = filesystem.exists(root.rstrip("/") + "/config.json")
    except Exception as error:  # credentials, missing bucket, network
        raise _unreadable(uri, field, error) from error
    if not found:
        raise _not_a_model(uri, field)


def resolve_model_metadata(path: str, cache_dir: Path, field: str) -> Path:
    """A local folder with the config and tokenizer of the model at `path`, without its weights: what the driver
    reads (a head pod need not hold a copy of every model). tiny:// is built whole (it is small); a local
    folder is used in place; hf:// and s3:// fetch only METADATA_FILES (s3:// into <cache>/metadata/)."""
    if path.startswith("hf://"):
        return _resolve_hub(path.removeprefix("hf://"), cache_dir, field, METADATA_FILES)
    if path.startswith(("s3://", "gs://")):
        return _resolve_object_store(path, cache_dir / "metadata", field, METADATA_FILES)
    return resolve_model_path(path, cache_dir, field)


def resolve_model_path(path: str, cache_dir: Path, field: str) -> Path:
    """A local folder for the model at `path` (see the module docstring); `field` names it in errors."""
    if path.startswith("tiny://"):
        return _resolve_tiny(path.removeprefix("tiny://"), cache_dir, field)
    if path.startswith("hf://"):
        return _resolve_hub(path.removeprefix("hf://"), cache_dir, field)
    if path.startswith(("s3://", "gs://")):
        return _resolve_object_store(path, cache_dir, field)
    return _resolve_local(path, field)
