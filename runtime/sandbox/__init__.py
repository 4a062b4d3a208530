"""Run untrusted Python code in a confined process. Knows nothing about RL; stdlib only.

    outcome = run_python("sum(range(10))", Limits(wall_seconds=5))
    outcome.stdout      # '45\\n' (a final expression is printed, as in a notebook cell)
    outcome.stopped_by  # None, or why it was stopped: wall_time, cpu_time, memory, signal ...

Each call gets a fresh process tree (see `launcher.py` for how it is built), and is held as a whole:
- namespaces of its own: user, mount, network, pid, ipc, uts. The network namespace has only a
  loopback device, down: no connection leaves, not even to localhost. Its pid namespace ends when
  the code's process ends, and the kernel kills every process the code left behind.
- a root filesystem of its own, read-only: the Python installation, /usr, /dev/null, /dev/zero,
  /dev/(u)random, and the scratch folder read-write at /scratch (also cwd, HOME and TMPDIR): a tmpfs of
  `Limits.scratch_bytes` (and 4096 files) that goes with the call's mount namespace.
  Nothing else of the machine is visible: no /tmp, no /etc, no credentials, no worker files.
- no capabilities and no_new_privs, as uid 0 of its user namespace, which is an unprivileged
  uid outside: a fresh uid per call when the caller is root, the caller's own uid otherwise.
- memory for the call as a whole (`Limits.memory_bytes`): a memory cgroup of its own where this process
  may make one (cgroup.py; scratch included, the kernel's OOM killer ends the call past it), else the limit
  split evenly over the processes it may start (RLIMIT_AS of memory_bytes / processes each). Either way
  each process's RLIMIT_AS makes a single allocation past it a MemoryError the code can read, and the
  call's processes are the first the OOM killer takes (oom_score_adj 1000) should the pod run short.
- rlimits: CPU time (SIGXCPU), address space, processes (RLIMIT_NPROC binds because the outside uid
  is not root), file size, open files, no core dumps.
- at most `set_calls_at_once(n)` calls at once in this process; more wait their turn.
- a wall-clock deadline enforced by the launcher (and, as a backstop, by this module).
- a clean environment (PATH, HOME, TMPDIR, LANG only), stdin from /dev/null, stdout and stderr
  captured to files and cut to `Limits.output_bytes`.
The control folder (and the call's cgroup) are removed afterwards, whatever happened.

Requirements: Linux, and permission to create a user namespace (unprivileged user namespaces,
or root). A Kubernetes pod needs a seccomp profile that allows it (see docs/security.md);
`check_isolation` says what is missing. Departure from peers that shell out to `bwrap` or
`nsjail`: no binary to install in the image; the same confinement in ~300 lines we can test.
"""

import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kuberl.runtime.sandbox.cgroup import memory_cgroups

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("launcher.py")
#: Outside uids handed to the code when the caller is root: one per call, so RLIMIT_NPROC counts one run's processes.
ROOT_CALLER_UID_BASE = 1_800_000_000
_uids = itertools.count()
_uid_lock = threading.Lock()
SIGXCPU = signal.SIGXCPU
#: How long past the wall clock this process waits for the launcher before killing its process group.
BACKSTOP_SECONDS = 10.0
#: The host paths the code can read: the Python installation (added at run time) and shared libraries.
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/bin", "/lib32", "/libx32")
#: The scratch folder's size: a tmpfs, so memory the call holds on top of its memory limit.
SCRATCH_BYTES = 64 << 20
#: Calls that run at once in a process unless set_calls_at_once says otherwise.
DEFAULT_CALLS_AT_ONCE = os.cpu_count() or 1
_slots = threading.BoundedSemaphore(DEFAULT_CALLS_AT_ONCE)


def set_calls_at_once(calls: int) -> None:
    """At most `calls` runs at once in this process from now on; the others wait for a free one (before their
    wall clock starts). Each run holds up to its memory and scratch, so this bounds what the runs of a worker
    hold together: an environment worker sets it from its CPUs (api/topology.py tool_calls_at_once)."""
    global _slots
    if calls < 1:
        raise ValueError(f"calls at once must be at least 1, got {calls}")
    _slots = threading.BoundedSemaphore(calls)


def memory_bound() -> str:
    """How a run's memory limit holds its processes together here (for logs and the worker's self-test)."""
    cgroups = memory_cgroups()
    if cgroups is not None:
        return f"a memory cgroup per call ({cgroups})"
    return "no cgroup this process may make: the limit split evenly over the processes a call may start"


class SandboxUnavailable(RuntimeError):
    """This machine (or pod) cannot confine code; the message says what is missing and what to do."""


@dataclass(frozen=True)
class Limits:
    """What one run may use: memory, scratch, processes and the wall clock for the run as a whole; CPU time, file
    size and open files for each of its processes."""

    wall_seconds: float = 10.0  # the whole run, start-up included
    cpu_seconds: float = 10.0  # CPU time of the code's process (rounded up to whole seconds)
    memory_bytes: int = 512 << 20  # memory of all the run's processes together
    processes: int = 8  # processes (and threads) the code may have at once
    file_bytes: int = 16 << 20  # largest file the code may write, stdout and stderr included
    scratch_bytes: int = SCRATCH_BYTES  # the whole /scratch folder (a tmpfs: memory, beside memory_bytes)
    open_files: int = 64
    output_bytes: int = 8192  # stdout and stderr each come back cut to this

    def address_space(self, cgroup: bool) -> int:
        """RLIMIT_AS of each process: the whole limit when a cgroup holds the sum, else an even share of it."""
        return self.memory_bytes if cgroup else self.memory_bytes // self.processes


@dataclass(frozen=True)
class Outcome:
    """How a run ended and what it printed."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when a signal or the wall clock ended it
    stopped_by: str | None  # None: it ended by itself; else wall_time, cpu_time, memory, signal N, output
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.stopped_by is None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _python_paths() -> list[str]:
    """The installation the launcher's interpreter runs from (the stdlib and its C extensions)."""
    paths = {sys.base_prefix, sysconfig.get_paths()["stdlib"]}
    return sorted(paths)


def _outside_ids() -> tuple[int, int]:
    if os.getuid() != 0:
        return os.getuid(), os.getgid()
    with _uid_lock:
        offset = (os.getpid() % 4096) * 65536 + next(_uids) % 65536
    return ROOT_CALLER_UID_BASE + offset, ROOT_CALLER_UID_BASE + offset


def _read_cut(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "\n[output cut]" if len(data) > limit else text


def _stopped_by(report: dict, stderr: str) -> tuple[int | None, str | None]:
    if report.get("wall_time"):
        return None, "wall_time"
    if "signal" in report:
        number = int(report["signal"])
        if number == SIGXCPU or number == signal.SIGKILL:  # SIGKILL follows SIGXCPU after a second
            return None, "cpu_time"
        return None, f"signal {signal.Signals(number).name}"
    code = int(report.get("exit_code", 1))
    if code != 0 and "MemoryError" in stderr:
        return code, "memory"
    if code != 0 and "File too large" in stderr:
        return code, "output"
    return code, None


def run_python(code: str, limits: Limits = Limits()) -> Outcome:
    """Runs `code` in a fresh confined process and returns what happened; never raises for the code's sake.

    Waits first while `set_calls_at_once` runs are under way. Raises SandboxUnavailable when the confinement
    itself cannot be set up.
    """
    with _slots:
        cgroups = memory_cgroups()
        cgroup = cgroups.create(limits.memory_bytes + limits.scratch_bytes) if cgroups is not None else None
        try:
            outcome = _run(code, limits, cgroup)
            if cgroup is not None and cgroups is not None and cgroups.oom_killed(cgroup):
                return Outcome(outcome.stdout, outcome.stderr, None, "memory", outcome.seconds)
            return outcome
        finally:
            if cgroup is not None and cgroups is not None:
                cgroups.remove(cgroup)


def _run(code: str, limits: Limits, cgroup: Path | None) -> Outcome:
    base = Path(tempfile.mkdtemp(prefix="kuberl-sandbox-"))
    try:
        uid, gid = _outside_ids()
        os.chmod(base, 0o711)  # the code's uid must pass through to its root
        control = base / "control"
        control.mkdir(mode=0o700)
        root = base / "root"  # launcher.ROOT
        root.mkdir(mode=0o755)
        (control / "code.py").write_text(code, encoding="utf-8")
        config = {
            "code_path": str(control / "code.py"),
            "status_path": str(control / "status.json"),
            "root": str(root),
            "read_only": _python_paths() + list(SYSTEM_PATHS),
            "uid": uid,
            "gid": gid,
            "drop_groups": os.getuid() == 0,
            "cgroup": str(cgroup) if cgroup is not None else None,
            "address_space_bytes": limits.address_space(cgroup is not None),
            "limits": asdict(limits),
        }
        return _supervise(config, control, limits)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _supervise(config: dict, control: Path, limits: Limits) -> Outcome:
    started = time.monotonic()
    stdout_path, stderr_path = control / "stdout", control / "stderr"
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        launcher = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        # the launcher keeps the deadline; this timer is the backstop should the launcher itself hang
        backstop = threading.Timer(limits.wall_seconds + BACKSTOP_SECONDS, _kill_group, (launcher.pid,))
        backstop.start()
        try:
            launcher.wait()
        finally:
            backstop.cancel()
    status = Path(config["status_path"])
    report = json.loads(status.read_text()) if status.is_file() else {"wall_time": True}
    out = _read_cut(stdout_path, limits.output_bytes)
    err = _read_cut(stderr_path, limits.output_bytes)
    if "error" in report:
        raise SandboxUnavailable(
            f"the sandbox could not confine the code: {report['error']}. It needs Linux user namespaces: "
            "unprivileged user namespaces enabled (user.max_user_namespaces > 0), and in a container a "
            "seccomp profile that allows unshare/clone with CLONE_NEWUSER (see docs/security.md)"
        )
    if launcher.returncode != 0 and not report:
        raise SandboxUnavailable(f"the sandbox launcher failed (exit {launcher.returncode}): {err.strip()}")
    exit_code, stopped_by = _stopped_by(report, err)
    return Outcome(out, err, exit_code, stopped_by, time.monotonic() - started)


def check_isolation() -> None:
    """Raises SandboxUnavailable (saying what is missing) unless code can be confined here."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the sandbox needs Linux namespaces; this is {sys.platform}")
    outcome = run_python("print(6 * 7)", Limits(wall_seconds=30, cpu_seconds=10))
    if outcome.stdout.strip() != "42":
        raise SandboxUnavailable(
            f"the sandbox's self-test printed {outcome.stdout!r} (stderr {outcome.stderr.strip()!r}, "
            f"stopped by {outcome.stopped_by}); expected '42'"
        )
