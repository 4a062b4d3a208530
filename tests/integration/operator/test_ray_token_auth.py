"""A job's Ray cluster refuses a job submitted without its token (real Ray, token authentication as configured),
and gives a stopped driver the RLJob's stop grace period (the RayJob's runtimeEnvYAML, read by Ray's supervisor).

The operator's part is the RayJob's `authOptions` and the Secret it creates with a fresh token; KubeRay's
part, which cannot run here, is to put that token into the Ray containers. This test plays KubeRay's part
(`kuberay_auth_env`, after its `configureAuth`: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from the Secret's
`auth_token`) and starts a real Ray head with its dashboard, whose Jobs API is what `ray job submit` uses
and what an attacker on the pod network would call. The head runs in a process of its own, stopped by
closing its stdin (ray.shutdown), never by `ray stop`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.api import parse_rljob
from kuberl.operator.access import RAY_TOKEN_KEY, build_ray_token_secret, with_new_token
from kuberl.operator.builders import Owner, build_rayjob
from tests.integration.envtest import free_port
from tests.unit.operator.conftest import UID, base_spec, make_rljob

pytestmark = pytest.mark.integration

HEAD = """
import inspect, sys, ray
from ray._private.parameter import RayParams
# The dashboard agent's port: Ray's default (52365) is taken when the session's Ray already runs on this machine,
# and a head without its agent refuses every job submission ("No available agent"). ray.init has no argument for it.
init = RayParams.__init__
with_defaults = [n for n, p in inspect.signature(init).parameters.items() if p.default is not inspect.Parameter.empty]
defaults = list(init.__defaults__)
defaults[with_defaults.index("dashboard_agent_listen_port")] = int(sys.argv[3])
init.__defaults__ = tuple(defaults)
ray.init(include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=int(sys.argv[1]), num_cpus=1,
         _temp_dir=sys.argv[2])
print("READY", flush=True)
sys.stdin.read()
ray.shutdown()
"""


def kuberay_auth_env(rayjob: dict[str, Any], secrets: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The environment KubeRay gives every Ray container of a cluster with `authOptions` (its stand-in here)."""
    options = rayjob["spec"]["rayClusterSpec"]["authOptions"]
    assert options["mode"] == "token"
    secret = secrets[options["secretName"]]
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secret["stringData"][RAY_TOKEN_KEY]}


@pytest.fixture(scope="module")
def authenticated_head() -> Iterator[tuple[str, str]]:
    """(dashboard URL, token) of a real Ray head started as the job's RayJob and Secret configure it."""
    owner = Owner(name="tiny-grpo", namespace="team-a", uid=UID)
    rayjob = build_rayjob(parse_rljob(make_rljob(base_spec())), owner, 0, default_image="i:1", generation=1)
    secret = with_new_token(build_ray_token_secret(owner))  # what the operator creates
    auth = kuberay_auth_env(rayjob, {secret["metadata"]["name"]: secret})
    port = free_port()
    # without RAY_ADDRESS: once the session's Ray runs in this process, ray.init would join it (no job agent)
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **auth, "RAY_USAGE_STATS_ENABLED": "0"}
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's (longer in an xdist worker's)
    temp = Path(tempfile.mkdtemp(prefix="kr-"))
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD, str(port), str(temp), str(free_port())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=temp,
        text=True,
    )
    try:
        assert head.stdout is not None
        lines = []
        for line in head.stdout:  # blocks until Ray is up (or the process ended)
            lines.append(line)
            if line.startswith("READY"):
                break
        else:
            pytest.fail(f"the Ray head did not start (exit {head.wait()}); its last lines:\n{''.join(lines[-40:])}")
        yield f"http://127.0.0.1:{port}", auth["RAY_AUTH_TOKEN"]
    finally:
        if head.stdin is not None:
            head.stdin.close()  # ray.shutdown() in the head process
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(10)
        shutil.rmtree(temp, ignore_errors=True)


def jobs_api(url: str, method: str, token: str | None = None, body: Any = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/api/jobs/", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_job_submitted_without_the_token_is_refused(authenticated_head: tuple[str, str]):
    url, _ = authenticated_head
    status, _ = jobs_api(url, "POST", body={"entrypoint": "env"})  # `ray job submit -- env`, to read the Secrets
    assert status == 401


def test_a_job_submitted_with_another_token_is_refused(authenticated_head: tuple[str, str]):
    url, token = authenticated_head
    status, text = jobs_api(url, "POST", token="x" * len(token), body={"entrypoint": "env"})
    assert status == 403 and "Invalid authentication token" in text


def test_the_jobs_own_token_is_let_in_and_nothing_refused_ran(authenticated_head: tuple[str, str]):
    url, token = authenticated_head
    deadline = time.monotonic() + 60
    status, text = jobs_api(url, "GET", token=token)
    while status != 200 and time.monotonic() < deadline:  # the job agent may still be starting
        time.sleep(0.5)
        status, text = jobs_api(url, "GET", token=token)
    assert status == 200
    submitted = [job for job in json.loads(text) if job["type"] == "SUBMISSION"]
    assert submitted == []  # the refused submissions above never ran


TRAPS_SIGTERM = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stopping(*_):
    out.write_text("SIGTERM\\n")
    time.sleep(6)  # a checkpoint's save
    out.write_text("SIGTERM\\nsaved\\n")
    sys.exit(75)
signal.signal(signal.SIGTERM, stopping)
out.write_text("running\\n")
time.sleep(300)
"""


def test_a_stopped_job_gets_the_rljobs_stop_grace_period_before_sigkill(
    authenticated_head: tuple[str, str], tmp_path: Path
):
    """KubeRay stops a RayJob's Ray job on suspend, a spec change or deletion; Ray's job supervisor then gives the
    driver RAY_JOB_STOP_WAIT_TIME_S (3 s by default) between SIGTERM and SIGKILL. The RayJob's runtimeEnvYAML
    carries runPolicy.stopGracePeriodSeconds there: a driver whose save takes 6 s finishes it."""
    url, token = authenticated_head
    spec = base_spec()
    spec["runPolicy"] = {"stopGracePeriodSeconds": 20}
    owner = Owner(name="tiny-grpo", namespace="team-a", uid=UID)
    rayjob = build_rayjob(parse_rljob(make_rljob(spec)), owner, 0, default_image="i:1", generation=1)
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])  # KubeRay sends it as the job's runtime_env
    script, out = tmp_path / "driver.py", tmp_path / "driver.out"
    script.write_text(TRAPS_SIGTERM)
    body = {"entrypoint": f"{sys.executable} {script} {out}", "runtime_env": runtime_env}
    deadline = time.monotonic() + 120
    status, text = jobs_api(url, "POST", token=token, body=body)
    while status == 500 and "No available agent" in text and time.monotonic() < deadline:  # the agent starts
        time.sleep(0.5)
        status, text = jobs_api(url, "POST", token=token, body=body)
    assert status == 200, text
    job_id = json.loads(text)["submission_id"]
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text() == "running\n"):
        assert time.monotonic() < deadline, "the driver did not start"
        time.sleep(0.2)
    request = urllib.request.Request(
        f"{url}/api/jobs/{job_id}/stop", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # what KubeRay's StopJob calls
        assert response.status == 200
    deadline = time.monotonic() + 40
    while (state := json.loads(jobs_api(url, "GET", token=token)[1])) and any(
        job["submission_id"] == job_id and job["status"] not in ("STOPPED", "FAILED", "SUCCEEDED") for job in state
    ):
        assert time.monotonic() < deadline, "the stopped job never ended"
        time.sleep(0.5)
    assert out.read_text() == "SIGTERM\nsaved\n", "the driver was killed before its save finished"
