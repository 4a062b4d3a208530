"""The sandbox holds: one test per attack, each run in a real confined process.

Every attack ends in an Outcome the caller can turn into an error message, never in an exception,
a hung caller, a process left behind, a byte on the network or a file outside the scratch folder.
The limits are small so the attacks end fast; the deadlines are generous because this machine is
shared (a CPU second of the code can take many seconds of wall time under load).
"""

import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kuberl.runtime import sandbox
from kuberl.runtime.sandbox import LAUNCHER, Limits, run_python

pytestmark = pytest.mark.integration

SMALL = Limits(wall_seconds=60, cpu_seconds=1, memory_bytes=256 << 20, processes=8)


def sandbox_processes() -> list[int]:
    """Pids of every process still running from a sandbox (all of them carry the launcher's command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(LAUNCHER).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone while we looked
            continue
    return found


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """The sandbox's folders land here, so a test can see that they are removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_final_expression_is_printed_and_the_scratch_folder_is_the_working_directory(private_tmp) -> None:
    outcome = run_python("open('notes.txt', 'w').write('hi')\nimport os\nsorted(os.listdir('.')), os.getcwd()", SMALL)
    assert outcome.ok, outcome
    assert outcome.stdout.strip() == "(['notes.txt'], '/scratch')"
    assert list(private_tmp.iterdir()) == [], "the scratch and control folders are removed afterwards"


def test_an_infinite_loop_is_stopped_by_the_cpu_time_limit() -> None:
    outcome = run_python("while True:\n    pass", SMALL)
    assert outcome.stopped_by == "cpu_time" and not outcome.ok
    assert sandbox_processes() == []


def test_code_that_sleeps_forever_is_stopped_by_the_wall_clock() -> None:
    outcome = run_python("import time\ntime.sleep(3600)", Limits(wall_seconds=1.5))
    assert outcome.stopped_by == "wall_time"
    assert outcome.seconds < 30
    assert sandbox_processes() == []


def test_a_run_stopped_by_the_clock_returns_once_every_process_of_it_has_ended() -> None:
    # processes whose memory takes the kernel a while to free: before, the launcher returned once its own child
    # was reaped, while the kernel was still ending the rest, and run_python failed to remove the run's memory
    # cgroup (OSError EBUSY: this test failed 3 runs of 3)
    code = (
        "import os, time\n"
        "memory = bytearray(256 << 20)\n"
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        memory[::4096] = b'x' * len(range(0, len(memory), 4096))  # pages of its own\n"
        "        time.sleep(3600)\n"
        "memory[::4096] = b'y' * len(range(0, len(memory), 4096))\n"
        "time.sleep(3600)\n"
    )
    outcome = run_python(code, Limits(wall_seconds=3, memory_bytes=2 << 30, processes=8))
    assert outcome.stopped_by == "wall_time", outcome.stderr
    assert sandbox_processes() == []


def test_a_fork_bomb_meets_the_process_limit_and_leaves_nothing_behind() -> None:
    bomb = (
        "import os, time\n"
        "alive = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(3600)\n"  # each child stays: only the limit stops the growth
        "            os._exit(0)\n"
        "        alive += 1\n"
        "except OSError as error:\n"
        "    print(alive, error.errno)\n"
    )
    outcome = run_python(bomb, SMALL)
    alive, errno = map(int, outcome.stdout.split())
    assert alive < SMALL.processes and errno == 11  # EAGAIN: RLIMIT_NPROC binds
    assert sandbox_processes() == [], "the sleeping children die with the sandbox's pid namespace"


def test_a_memory_hog_cannot_allocate_past_the_memory_limit() -> None:
    outcome = run_python("hog = bytearray(2 * 1024**3)\nprint('allocated')", SMALL)
    assert outcome.stopped_by == "memory"
    assert "MemoryError" in outcome.stderr and "allocated" not in outcome.stdout


def test_no_connection_leaves_the_sandbox_not_even_to_localhost() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    outcome = run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).send(b'leak')", SMALL
    )
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # the kernel queues a connection even before accept(): none came
        server.accept()
    server.close()
    assert "Network is unreachable" in outcome.stderr and outcome.exit_code == 1


def test_writes_outside_the_scratch_folder_fail_and_leave_no_file(tmp_path) -> None:
    target = tmp_path / "escaped.txt"
    code = (
        f"for path in [{str(target)!r}, '/tmp/escaped.txt', '/escaped.txt', '/usr/escaped.txt']:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as error:\n"
        "        print('refused', path, type(error).__name__)\n"
    )
    outcome = run_python(code, SMALL)
    assert outcome.ok, outcome
    assert "wrote" not in outcome.stdout and outcome.stdout.count("refused") == 4
    assert not target.exists() and not Path("/tmp/escaped.txt").exists()


def test_the_code_sees_no_credentials_of_the_worker(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    outcome = run_python("import os\nsorted(os.environ), os.listdir('/')", SMALL)
    assert "do-not-leak" not in outcome.stdout and "AWS" not in outcome.stdout
    assert "'etc'" not in outcome.stdout and "'tmp'" not in outcome.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become non-root")
def test_the_same_confinement_holds_for_a_caller_that_is_not_root(tmp_path) -> None:
    """A Kubernetes pod that runs as non-root: the caller is uid 1000, with no capabilities at all."""
    script = (
        "from kuberl.runtime.sandbox import Limits, run_python\n"
        "small = Limits(wall_seconds=60, cpu_seconds=1, memory_bytes=256 << 20, processes=8)\n"
        "print(run_python('import os; print(os.getuid(), os.getcwd())', small).stdout.strip())\n"
        "print(run_python('while True: pass', small).stopped_by)\n"
        # every child of the bomb prints its own traceback, so the last line of stderr may be any of them, cut
        "bomb = run_python('import os\\nwhile True: os.fork()', small).stderr.splitlines()\n"
        "print(next((line for line in bomb if line.startswith('BlockingIOError')), bomb[-1:]))\n"
        "print(run_python(\"import socket; socket.create_connection(('1.1.1.1', 80))\", small).stderr[-26:])\n"
    )
    setpriv = "setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all"
    drop = f"exec {setpriv} {sys.executable} -c {shlex.quote(script)}"
    as_user = show_to_uid_1000(python_and_checkout(), stage=tmp_path) + drop
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", as_user],
        capture_output=True,
        text=True,
        timeout=240,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    identity, loop, bomb, network = result.stdout.strip().splitlines()
    assert identity == "0 /scratch"  # uid 0 of its own user namespace: the caller's uid 1000 outside
    assert loop == "cpu_time"
    assert bomb.startswith("BlockingIOError")  # RLIMIT_NPROC binds for a non-root caller too
    assert network.endswith("Network is unreachable")


def python_and_checkout() -> list[Path]:
    """The folders uid 1000 must read to run `kuberl`: the Python, the virtual environment, this checkout."""
    checkout = Path(__file__).resolve().parents[3]
    return [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), checkout]


def closed_ancestor(folder: Path) -> Path | None:
    """The topmost folder above `folder` that others may not enter (no o+x), e.g. /root or a `mktemp -d`."""
    return next((up for up in reversed(folder.parents) if not os.stat(up).st_mode & stat.S_IXOTH), None)


def show_to_uid_1000(folders: list[Path], stage: Path) -> str:
    """Shell commands, for a private mount namespace, that let uid 1000 reach `folders` and nothing beside them.

    Each closed folder above one of them (this machine's Python lives under /root, mode 0700; a fresh clone may
    lie in a `mktemp -d`, mode 0700) is covered by an empty tmpfs that anyone may enter, and each folder is bound
    back at its own path inside it, so every path (the venv's `python` link, the editable install's mapping)
    still resolves. The folders are staged under `stage` first, which no tmpfs may cover.
    """
    needed = [f for f in folders if not any(other in f.parents for other in folders)]
    needed = list(dict.fromkeys(needed))
    closed = {up for f in needed if (up := closed_ancestor(f)) is not None}
    if not closed:
        return ""
    covered = [up for up in closed if up == stage or up in stage.parents]
    assert not covered, f"the staging folder {stage} lies in {covered}, which the tmpfs would hide"
    commands = []
    for index, folder in enumerate(needed):
        commands += [f"mkdir {stage}/{index}", f"mount --bind {shlex.quote(str(folder))} {stage}/{index}"]
    commands += [f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(up))}" for up in sorted(closed)]
    for index, folder in enumerate(needed):
        commands += [f"mkdir -p {shlex.quote(str(folder))}", f"mount --bind {stage}/{index} {shlex.quote(str(folder))}"]
    return " && ".join(commands) + " && "


#: Forks 5 children (with the code's process and the jail's init, 7 of the 8 processes a call may have) that each
#: take and touch 120 MiB and hold it until every child has answered (or died): prints how many held theirs at once.
FIVE_HOGS = """
import os, select
results_r, results_w = os.pipe()
release_r, release_w = os.pipe()
children = {}
for index in range(5):
    pid = os.fork()
    if pid == 0:
        os.close(results_r)
        os.close(release_w)
        try:
            hog = bytearray(120 << 20)
            hog[::4096] = b"x" * len(range(0, len(hog), 4096))  # every page touched: memory, not just address space
            os.write(results_w, b"+%d " % index)
        except MemoryError:
            os.write(results_w, b"-%d " % index)
        os.read(release_r, 1)  # holds it until the parent has heard from everyone
        os._exit(0)
    children[pid] = index
os.close(results_w)
os.close(release_r)
heard, dead = {}, set()
while len(set(heard) | dead) < 5:
    if select.select([results_r], [], [], 0.1)[0]:
        for word in os.read(results_r, 4096).split():
            heard[int(word[1:])] = word[:1] == b"+"
    for pid, index in children.items():
        if index not in dead and os.waitpid(pid, os.WNOHANG)[0]:
            dead.add(index)
held = [index for index, took in heard.items() if took and index not in dead]
print(len(held), "held at once;", sum(not took for took in heard.values()), "MemoryError;", len(dead), "killed")
os.close(release_w)
"""


@pytest.fixture(params=["cgroup", "split"])
def memory_bound(request, monkeypatch) -> str:
    """Each way a call's memory limit holds its processes together: a memory cgroup, and without one."""
    if request.param == "cgroup" and sandbox.memory_cgroups() is None:
        pytest.skip("this process may make no memory cgroup here")
    if request.param == "split":
        monkeypatch.setattr(sandbox, "memory_cgroups", lambda: None)  # as in a pod whose cgroup is read-only
    return request.param


def test_the_memory_limit_holds_all_of_a_calls_processes_together(memory_bound: str) -> None:
    limits = Limits(wall_seconds=120, cpu_seconds=30, memory_bytes=256 << 20, processes=8)
    outcome = run_python(FIVE_HOGS, limits)
    held = int(outcome.stdout.split()[0]) if outcome.stdout else 0  # nothing printed: the call was ended whole
    assert held * 120 <= 256, outcome  # before: all five held theirs, 600 MiB under a 256 MiB limit
    if memory_bound == "cgroup":
        assert outcome.stopped_by == "memory"  # the kernel killed what passed the call's cgroup
    else:
        assert outcome.ok and "0 held at once; 5 MemoryError" in outcome.stdout  # 32 MiB of address space each


#: Memory that outlives every address space it was in: 60 memfds, or SysV segments filled then detached, of 16 MiB.
MEMFD_HOARD = """
import os
for n in range(60):
    os.write(os.memfd_create("hoard"), b"x" * (16 << 20))
print("held 960 MiB")
"""
SHM_HOARD = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for n in range(60):
    segment = libc.shmget(0, 16 << 20, 0o1600)
    if segment < 0:
        raise PermissionError(ctypes.get_errno(), "shmget refused")
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # detached: no address space holds it, the segment does
print("held 960 MiB")
"""


@pytest.mark.parametrize("attack", [MEMFD_HOARD, SHM_HOARD], ids=["memfd", "sysv-shm"])
def test_memory_no_address_space_counts_is_refused(memory_bound: str, attack: str) -> None:
    outcome = run_python(attack, Limits(wall_seconds=60, cpu_seconds=30, memory_bytes=256 << 20))
    assert "held 960 MiB" not in outcome.stdout  # before: 60 memfds of 16 MiB each, under RLIMIT_AS alone
    assert "PermissionError" in outcome.stderr


def test_the_scratch_folder_holds_no_more_than_its_size_nor_its_files() -> None:
    code = (
        "import os\n"
        "written = files = 0\n"
        "try:\n"
        "    for n in range(200):\n"
        "        with open(f'big-{n}', 'wb') as out:\n"
        "            out.write(b'x' * (1 << 20))\n"
        "        written += 1\n"
        "except OSError as error:\n"
        "    print(written, 'MiB', error.strerror)\n"
        "try:\n"
        "    for n in range(100_000):\n"
        "        open(f'empty-{n}', 'w').close()\n"
        "        files += 1\n"
        "except OSError as error:\n"
        "    print(files, 'files', error.strerror)\n"
    )
    outcome = run_python(code, Limits(wall_seconds=120, cpu_seconds=60, scratch_bytes=16 << 20))
    size, count = outcome.stdout.splitlines()
    written = int(size.split()[0])
    assert written <= 16 and size.endswith("No space left on device")  # before: 200 MiB, on the node's disk
    assert int(count.split()[0]) < 4096 and count.endswith("No space left on device")


def launchers_of_this_process() -> int:
    """The sandbox runs under way in this process: the launchers it started itself."""
    count = 0
    for pid in sandbox_processes():
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:  # ended while we looked
            continue
        count += parent == os.getpid()
    return count


def test_no_more_calls_run_at_once_than_a_worker_allows() -> None:
    seen = []
    sandbox.set_calls_at_once(2)
    try:
        with ThreadPoolExecutor(6) as threads:  # six episodes' tool calls at once, as a worker's steps make them
            calls = [
                threads.submit(run_python, "import time\ntime.sleep(1.5)", Limits(wall_seconds=60)) for _ in range(6)
            ]
            while not all(call.done() for call in calls):
                seen.append(launchers_of_this_process())
                time.sleep(0.02)
    finally:
        sandbox.set_calls_at_once(sandbox.DEFAULT_CALLS_AT_ONCE)
    assert all(call.result().ok for call in calls)
    assert max(seen) == 2  # before: all six at once (a worker's 32 steps could each run one)
