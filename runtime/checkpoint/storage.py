"""Where checkpoints live: a local folder (or a mounted PVC) or an S3-compatible object store.

One small class, `Location`, hides the difference behind the few operations the commit
protocol needs. The one difference that matters is `renames_atomically`: on a POSIX
filesystem a folder rename is atomic and is the commit; on an object store a "rename" is a
copy of every object, so the commit there is a marker object written last (see store.py).

Object stores go through fsspec (s3fs for s3://). Credentials come as environment variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional AWS_ENDPOINT_URL for MinIO, Ceph, moto...),
which the operator sets from checkpoint.secretRef; `storage_options` (runtime/objectstore.py, shared
with data and models) turns the endpoint into the s3fs option.
"""

import os
import posixpath
import secrets

import fsspec
from fsspec.implementations.local import LocalFileSystem

from kuberl.runtime.objectstore import is_remote, storage_options, url_to_fs

__all__ = ["Location", "StorageError", "filesystem", "fsync_folder", "is_remote", "storage_options"]


class StorageError(RuntimeError):
    """A checkpoint location that cannot be used; the message names the location and what to do."""


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and the path inside it; a missing s3fs is named with what to install."""
    try:
        return url_to_fs(uri)
    except ImportError as error:
        raise StorageError(
            f"checkpoint uri {uri}: fsspec cannot open this scheme ({error}); "
            "install the filesystem package for it (s3fs for s3://) in the runtime image"
        ) from error


class Location:
    """A file or folder at a local path or an object-store URI."""

    def __init__(self, uri: str, fs: fsspec.AbstractFileSystem | None = None, path: str | None = None) -> None:
        if fs is None or path is None:
            fs, path = filesystem(uri)
        self.fs = fs
        self.path = path.rstrip("/") or "/"
        self.renames_atomically = isinstance(fs, LocalFileSystem)
        #: What ranks, refs and users are given: a plain path locally, scheme://path on an object store.
        self.uri = self.path if self.renames_atomically else str(fs.unstrip_protocol(self.path))

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def child(self, *names: str) -> "Location":
        path = posixpath.join(self.path, *names)
        return Location(path if self.renames_atomically else str(self.fs.unstrip_protocol(path)), self.fs, path)

    # -- reading ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        self.fs.invalidate_cache(self.path)
        return bool(self.fs.exists(self.path))

    def read_bytes(self) -> bytes:
        with self.fs.open(self.path, "rb") as stream:
            return bytes(stream.read())

    def folders(self) -> list[str]:
        """Names of the folders directly inside this one ([] when it does not exist)."""
        self.fs.invalidate_cache(self.path)
        try:
            entries = self.fs.ls(self.path, detail=True)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e["type"] == "directory")

    def files(self) -> dict[str, int]:
        """Every file below this folder: path relative to it -> size in bytes."""
        self.fs.invalidate_cache(self.path)
        try:
            found = self.fs.find(self.path, detail=True)
        except FileNotFoundError:
            return {}
        prefix = self.path.rstrip("/") + "/"
        return {
            name[len(prefix) :]: int(info["size"])
            for name, info in found.items()
            if info.get("type", "file") == "file" and name.startswith(prefix)
        }

    # -- writing ----------------------------------------------------------------------------------
    def makedirs(self) -> None:
        self.fs.makedirs(self.path, exist_ok=True)

    def write_bytes(self, data: bytes) -> None:
        """Write the whole file (its folder is made as needed); locally fsync'd, so a commit never exposes a hole."""
        if self.renames_atomically:
            os.makedirs(posixpath.dirname(self.path), exist_ok=True)
            with open(self.path, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
        else:
            with self.fs.open(self.path, "wb") as stream:
                stream.write(data)

    def replace_bytes(self, data: bytes) -> None:
        """Replace the file so that a reader sees the old or the new content, never a mix.

        Locally: a temporary file beside it, fsync'd, renamed over it. On an object store one PUT of
        a small object is already all-or-nothing.
        """
        if not self.renames_atomically:
            self.write_bytes(data)
            return
        temporary = f"{self.path}.tmp-{secrets.token_hex(4)}"
        try:
            with open(temporary, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, self.path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        fsync_folder(posixpath.dirname(self.path))

    def rename(self, target: "Location") -> None:
        """Atomic folder rename (local filesystems only), made durable by fsyncing both parents.

        The folder's own entries (and its subfolders') are fsync'd first, so that after a power
        loss the renamed folder never lacks a file that was written into it before.
        """
        if not self.renames_atomically:
            raise StorageError(f"{self.uri}: an object store cannot rename atomically; commit with a marker instead")
        for folder, _, _ in os.walk(self.path):
            fsync_folder(folder)
        os.rename(self.path, target.path)
        fsync_folder(posixpath.dirname(target.path))
        if posixpath.dirname(self.path) != posixpath.dirname(target.path):
            fsync_folder(posixpath.dirname(self.path))

    def remove(self) -> None:
        """Delete this file or folder and everything below it; nothing when it is already gone."""
        try:
            if self.fs.isdir(self.path):
                self.fs.rm(self.path, recursive=True)
            elif self.fs.exists(self.path):
                self.fs.rm(self.path)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(self.path)


def fsync_folder(path: str) -> None:
    """Make a rename or a new entry in `path` durable (POSIX: the folder's own entry list)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
