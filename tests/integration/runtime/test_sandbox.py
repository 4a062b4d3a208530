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
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

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
def test_the_same_confinement_holds_for_a_caller_that_is_not_root() -> None:
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
    # this machine's Python lives under /root (mode 0700): show uid 1000 the Python folder, nothing more
    setpriv = "setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all"
    drop = f"exec {setpriv} {sys.executable} -c {shlex.quote(script)}"
    parts = Path(sys.base_prefix).parts
    hidden, inner = Path(*parts[:2]), Path(*parts[:3])  # /root, /root/.pyenv
    as_user = drop
    if hidden == Path("/root"):
        as_user = (
            f"mkdir -p /tmp/kuberl-python-view && mount --bind {inner} /tmp/kuberl-python-view && "
            f"mount -t tmpfs -o mode=755 tmpfs {hidden} && mkdir -p {inner} && "
            f"mount --bind /tmp/kuberl-python-view {inner} && {drop}"
        )
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
