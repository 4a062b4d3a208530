"""A memory cgroup per sandbox call, where this process may make one. Stdlib only, no RL knowledge.

    cgroups = memory_cgroups()              # None where this process cannot make one
    folder = cgroups.create(limit_bytes)    # the call's processes join it (launcher.py, first thing the jail does)
    cgroups.oom_killed(folder)              # whether the kernel killed one of them for passing the limit
    cgroups.remove(folder)

RLIMIT_AS holds one process; a cgroup's memory limit holds every process of the call together, their
tmpfs pages (the scratch folder) included, and the kernel's OOM killer ends what passes it. Making one
needs a memory controller this process may write under its own cgroup:
- cgroup v2: a delegated subtree, where the memory controller is enabled for our cgroup's children
  (`cgroup.subtree_control` lists `memory`) and we may create them. In the call's cgroup `memory.max` is
  the limit, `memory.swap.max` 0 and `memory.oom.group` 1 (the whole call ends together).
- cgroup v1: a writable memory hierarchy (a root process on a host that mounts one). `memory.limit_in_bytes`
  is the limit, and `memory.memsw.limit_in_bytes` the same where swap is accounted.
A Kubernetes pod that runs as non-root mounts its cgroup read-only: there the sandbox splits the limit over the
processes a call may start instead (`sandbox.Limits`), and the pod's own memory limit is the backstop.
Where each file comes from: the kernel's Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst.
"""

import itertools
import os
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_names = itertools.count()
_names_lock = threading.Lock()


@dataclass(frozen=True)
class MemoryCgroups:
    """Where this process makes the calls' cgroups: a folder of a memory hierarchy it may write, and its version."""

    parent: Path
    version: int  # 1 or 2

    def __str__(self) -> str:
        return f"cgroup v{self.version} memory controller at {self.parent}"

    def create(self, limit_bytes: int) -> Path:
        """A fresh cgroup holding its processes to `limit_bytes` of memory together, without swap."""
        with _names_lock:
            folder = self.parent / f"kuberl-sandbox-{os.getpid()}-{next(_names)}"
        folder.mkdir()
        try:
            if self.version == 2:
                (folder / "memory.max").write_text(str(limit_bytes))
                _write_if_present(folder / "memory.swap.max", "0")
                _write_if_present(folder / "memory.oom.group", "1")
            else:
                (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
                _write_if_present(folder / "memory.memsw.limit_in_bytes", str(limit_bytes))
        except OSError:
            folder.rmdir()
            raise
        return folder

    def oom_killed(self, folder: Path) -> bool:
        """Whether the kernel killed a process of `folder` for passing its limit."""
        events = folder / ("memory.events" if self.version == 2 else "memory.oom_control")
        try:
            counts = dict(line.split() for line in events.read_text().splitlines() if len(line.split()) == 2)
        except OSError:
            return False
        return int(counts.get("oom_kill", "0")) > 0

    def remove(self, folder: Path) -> None:
        """Removes the call's cgroup once its processes are gone (they are: the call has ended)."""
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        path.write_text(value)


@cache
def memory_cgroups() -> MemoryCgroups | None:
    """Where this process can make the calls' memory cgroups, or None (then each call's limit is split per process)."""
    own = _own_cgroups()
    for fstype, point, root, options in _cgroup_mounts():
        if fstype == "cgroup2" and "" in own:
            folder = _folder(point, root, own[""])
            if _enabled_for_children(folder) and os.access(folder, os.W_OK):
                return MemoryCgroups(folder, 2)
        elif fstype == "cgroup" and "memory" in options and "memory" in own:
            folder = _folder(point, root, own["memory"])
            if (folder / "memory.limit_in_bytes").exists() and os.access(folder, os.W_OK):
                return MemoryCgroups(folder, 1)
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller (`memory`; "" for the v2 hierarchy), from /proc/self/cgroup."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _cgroup_mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(fstype, mount point, root in the hierarchy, super options) of each cgroup mount, from /proc/self/mountinfo."""
    mounts: list[tuple[str, Path, str, set[str]]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, described = head.split(), tail.split()
        if len(fields) >= 5 and len(described) >= 3 and described[0] in ("cgroup", "cgroup2"):
            mounts.append((described[0], Path(fields[4]), fields[3], set(described[2].split(","))))
    return mounts


def _folder(point: Path, root: str, own: str) -> Path:
    """Our cgroup's folder under a mount of the hierarchy that shows it from `root`."""
    relative = os.path.relpath(own, root) if own.startswith(root) else own.lstrip("/")
    return point if relative == "." else point / relative


def _enabled_for_children(folder: Path) -> bool:
    try:
        return "memory" in (folder / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
