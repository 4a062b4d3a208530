"""runtime/podinit.py, a worker pod's first process, run as a process of its own around a stand-in for `ray start`.

The stand-in plays `ray start --block` at the moment that matters: told to stop, it keeps running (as Ray's drain
does while it waits for the GCS, up to the stop window), with a child of its own (the raylet). A listening socket
plays the head's GCS. podinit checks the GCS every CHECK_SECONDS, set shorter here (0.2 s) so a case takes seconds.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.runtime import podinit

#: A `ray start` that, told to stop, writes down the signal and keeps running with its child (unless EXIT_ON_TERM is
#: set: then it exits with that code, as a drain that finished does); SIGUSR1 makes it exit 3, as `ray start --block`
#: does when its raylet died; with no signal it runs until killed.
RAY_START = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    folder = Path(sys.argv[1])
    (folder / "argv").write_text("\\n".join(sys.argv[2:]))
    raylet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (folder / "pid").write_text(str(os.getpid()))
    (folder / "raylet").write_text(str(raylet.pid))
    def told_to_stop(signum, frame):
        (folder / "signal").write_text(str(signum))
        if os.environ.get("EXIT_ON_TERM"):
            raylet.kill()
            sys.exit(int(os.environ["EXIT_ON_TERM"]))
    signal.signal(signal.SIGTERM, told_to_stop)
    signal.signal(signal.SIGUSR1, lambda *_: (raylet.kill(), sys.exit(3)))
    print("Ray runtime started.", flush=True)
    while True:
        time.sleep(0.1)
    """
)
#: How long a case may wait for what podinit does within a few checks (generous: a busy machine).
DEADLINE_SECONDS = 30.0


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status == "Z"  # ended, not yet reaped by whoever adopted it


def wait_for(condition, what: str, timeout: float = DEADLINE_SECONDS) -> None:  # noqa: ANN001 - a callable
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def gcs() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def start_podinit(
    folder: Path, gcs: socket.socket, *, exit_on_term: int | None = None, extra: str = ""
) -> subprocess.Popen[str]:
    script = folder / "ray_start.py"
    script.write_text(RAY_START)
    env = {
        **os.environ,
        podinit.RAY_START_COMMAND_ENV: f"{sys.executable} {script} {folder} {extra}",
        podinit.GCS_ADDRESS_ENV: f"127.0.0.1:{gcs.getsockname()[1]}",
    }
    if exit_on_term is not None:
        env["EXIT_ON_TERM"] = str(exit_on_term)
    code = "import sys; from kuberl.runtime import podinit; podinit.CHECK_SECONDS = 0.2; sys.exit(podinit.main())"
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wait_for(lambda: (folder / "raylet").is_file(), "the stand-in ray start is up")
    return process


def test_a_pod_asked_to_stop_after_its_head_is_gone_ends_at_once_with_everything_under_it(tmp_path, gcs):
    pod = start_podinit(tmp_path, gcs)
    raylet = int((tmp_path / "raylet").read_text())
    pod.send_signal(signal.SIGTERM)
    wait_for(lambda: (tmp_path / "signal").is_file(), "ray start told to stop")
    assert int((tmp_path / "signal").read_text()) == signal.SIGTERM
    # the head's GCS still answers: ray start drains for as long as it takes, podinit waits with it
    time.sleep(2.0)  # ten checks
    assert pod.poll() is None, pod.communicate()[0]
    gcs.close()  # the head pod ended
    wait_for(lambda: pod.poll() is not None, "podinit ends once the GCS is gone")
    output = pod.communicate()[0]
    assert pod.returncode == 0, output
    assert "is gone" in output and "ending the node's processes now" in output
    wait_for(lambda: gone(raylet), "the raylet killed with ray start")


def test_a_head_lost_while_the_pod_runs_is_left_to_ray_and_the_pod_ends_with_ray_starts_exit_code(tmp_path, gcs):
    pod = start_podinit(tmp_path, gcs)
    gcs.close()  # not asked to stop: podinit does not act on the GCS alone
    time.sleep(1.0)  # five checks' time
    assert pod.poll() is None, pod.communicate()[0]
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGUSR1)  # ray start gives up on its own
    assert pod.wait(DEADLINE_SECONDS) == 3


def test_a_drain_that_finishes_ends_the_pod_with_ray_starts_exit_code_and_kuberays_quoting_holds(tmp_path, gcs):
    resources = '--resources="{\\"kuberl_actor\\": 8}"'  # as KubeRay writes a quoted rayStartParams value
    pod = start_podinit(tmp_path, gcs, exit_on_term=1, extra=f"--address=head:6379 {resources} --block")
    assert (tmp_path / "argv").read_text().split("\n") == [
        "--address=head:6379",
        '--resources={"kuberl_actor": 8}',
        "--block",
    ]
    pod.send_signal(signal.SIGTERM)
    assert pod.wait(DEADLINE_SECONDS) == 1


def test_without_kuberays_command_it_says_what_is_missing():
    env = {key: value for key, value in os.environ.items() if key != podinit.RAY_START_COMMAND_ENV}
    result = subprocess.run(
        [sys.executable, "-m", "kuberl.runtime.podinit"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert f"{podinit.RAY_START_COMMAND_ENV} is not set" in result.stderr


def test_the_gcs_is_checked_where_it_was_found_while_the_pod_ran_and_counts_as_gone_when_nothing_listens(
    gcs, monkeypatch
):
    port = gcs.getsockname()[1]
    answers = {"head-svc": "127.0.0.1"}  # a FAKE name server (this machine's cannot be told to drop a name)

    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, number, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - getaddrinfo's shape
        if host == "127.0.0.1":  # an address: no name server asked
            return real_getaddrinfo(host, number, *args, **kwargs)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], number))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    head = podinit.Head(f"head-svc:{port}")
    assert head.endpoint == ("127.0.0.1", port) and head.reachable()
    del answers["head-svc"]  # the Service stops listing the head while it still runs: it still counts as there
    monkeypatch.setattr(podinit, "RESOLVE_SECONDS", 0.0)
    head.follow()
    assert head.endpoint == ("127.0.0.1", port) and head.reachable()
    gcs.close()  # the head's GCS ended
    assert not head.reachable()
    assert not podinit.Head(f"never-listed:{port}").reachable()
