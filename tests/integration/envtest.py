"""A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager, no Docker.

The binaries come from `hack/envtest/build.sh` (cached; about 5 minutes to build on a fresh machine,
0.1 s after). `start_control_plane()` starts them on free loopback ports with token authentication
and RBAC (the admin token is in `system:masters`), audit-logs every request of a ServiceAccount
(`ControlPlane.audit_log`: which verbs an identity really used), installs the given CRDs *before* the
controller-manager starts (so its garbage collector discovers them at once), writes a kubeconfig
and returns a `ControlPlane` that stops everything by PID. The flags are the ones
hack/envtest/README.md verified.

Use it from a conftest:

    from tests.integration.envtest import control_plane, namespace  # noqa: F401  (pytest fixtures)

`control_plane` is session-scoped and sets KUBECONFIG for the session; `namespace` gives each test a
namespace of its own and deletes it afterwards. `bench/operator.py` uses `start_control_plane()` directly.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "envtest" / "build.sh"
RLJOB_CRD = REPO / "crds" / "kuberl.io_rljobs.yaml"
#: Test stand-ins for KubeRay's own RayJob and RayCluster CRDs (structural, schema-less specs).
FAKE_KUBERAY_CRDS = sorted((REPO / "tests" / "integration" / "operator" / "crds").glob("fake-kuberay-*.yaml"))
#: The controllers the operator's behaviour depends on: owner-reference GC and namespace deletion.
CONTROLLERS = "garbagecollector,namespace"
#: Audit only ServiceAccounts (tests authenticate as one with TokenRequest tokens; the admin and the
#: controller-manager are not in the group), at Metadata level: who did which verb on what, and the answer.
#: Every stage: a watch that is being served shows up at RequestReceived and only completes when it ends.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
}


class BackgroundBuild:
    """build.sh at low priority in a process group of its own, so that on a fresh machine the minutes of
    building overlap the tests that need no API server (pytest's testpaths run those first).

    With the binaries cached it ends in a tenth of a second. `envtest_binaries()` runs the script again
    in the foreground: build.sh's lock makes that call wait for this build instead of starting a second
    one, and a failed build is retried there and reported with its output. This build's own output goes
    to `log`; `failure()` gives its tail when it failed, so a build that failed beside the tests and was
    then rebuilt in the foreground does not go unexplained. `stop()` ends a build still running (the
    script's exit trap removes its work folder) and removes the log.
    """

    def __init__(self) -> None:
        descriptor, log = tempfile.mkstemp(prefix="kuberl-envtest-build-", suffix=".log")
        os.close(descriptor)
        self.log = Path(log)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                ["nice", "-n", "10", "bash", str(BUILD_SCRIPT)],
                stdout=subprocess.DEVNULL,
                stderr=out,
                cwd=tempfile.gettempdir(),
                start_new_session=True,
            )
        self.stopped = False

    def failure(self) -> str | None:
        """The end of the build's output if it ended with an error (not stopped by `stop()`), else None."""
        if self.stopped or self.process.poll() in (None, 0):
            return None
        tail = self.log.read_text(errors="replace")[-4000:]
        return f"{BUILD_SCRIPT} in the background failed ({self.process.returncode}); the end of its output:\n{tail}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.stopped = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.unlink(missing_ok=True)


def envtest_binaries() -> Path:
    """The folder holding etcd, kube-apiserver and kube-controller-manager (builds them once)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "bin"


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_service_account_keys(private: Path, public: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def kubeconfig_for(server: str, token: str, ca_file: Path) -> dict[str, Any]:
    """Token auth; the CA is the serving certificate kube-apiserver generates in --cert-dir (it holds its CA)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "admin"}}],
        "current-context": "envtest",
    }


@dataclass
class ControlPlane:
    """A running control plane. `request()` is a tiny REST client for fixtures that must not import kubernetes."""

    server: str
    token: str
    kubeconfig: Path
    workdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ca_file(self) -> Path:
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one audit event per request of a ServiceAccount (see AUDIT_POLICY)."""
        return self.workdir / "audit.log"

    def request(
        self, method: str, path: str, body: object = None, content_type: str = "application/json", accept: str = ""
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        request = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else None

    def install_crds(self, paths: Sequence[Path]) -> None:
        """Create each CRD and wait until the apiserver serves it."""
        names = []
        for path in paths:
            for document in yaml.safe_load_all(path.read_text()):
                if document:
                    self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", document)
                    names.append(document["metadata"]["name"])
        for name in names:
            wait_until(lambda name=name: self._established(name), timeout=30, what=f"CRD {name} established")

    def _established(self, name: str) -> bool:
        crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = crd.get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    def log_tail(self, process: str, chars: int = 3000) -> str:
        path = self.workdir / f"{process}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """Stop every process by its PID (controller-manager first, etcd last) and remove the work dir."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
        shutil.rmtree(self.workdir, ignore_errors=True)


def wait_until(check: Any, *, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `check()` until it returns something truthy; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as error:  # noqa: BLE001 - a poll tolerates failures until the deadline
            last_error = error
        else:
            if result:
                return result
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last_error})" if last_error else "")
    )


def _spawn(cp: ControlPlane, name: str, argv: list[str]) -> None:
    log = (cp.workdir / f"{name}.log").open("wb")
    cp.processes[name] = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cp.workdir, start_new_session=True
    )


def start_control_plane(
    crds: Sequence[Path] = (), *, start_controller_manager: bool = True, controllers: str = CONTROLLERS
) -> ControlPlane:
    """Start etcd, kube-apiserver and (after installing `crds`) kube-controller-manager running `controllers`;
    wait until ready. The controller-manager holds the ServiceAccount signing key and the API server's CA, which
    the `serviceaccount-token` controller needs to fill Secrets of type kubernetes.io/service-account-token."""
    binaries = envtest_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="kuberl-envtest-"))
    token = secrets.token_hex(16)
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    (workdir / "tokens.csv").write_text(f"{token},admin,admin,system:masters\n")
    (workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
    write_service_account_keys(workdir / "sa.key", workdir / "sa.pub")
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(server, token, workdir / "certs" / "apiserver.crt")))
    cp = ControlPlane(server=server, token=token, kubeconfig=kubeconfig, workdir=workdir)
    try:
        _spawn(
            cp,
            "etcd",
            [
                str(binaries / "etcd"),
                "--name=default",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # a throwaway store: fsync only slows the tests
            ],
        )
        _spawn(
            cp,
            "kube-apiserver",
            [
                str(binaries / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                "--insecure-port=0",
                f"--cert-dir={workdir / 'certs'}",
                f"--service-account-key-file={workdir / 'sa.pub'}",
                f"--service-account-signing-key-file={workdir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--token-auth-file={workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                # Webhooks addressed by Service reach the Service's Endpoints (no DNS or kube-proxy here), as
                # the chart's webhook is: tests/integration/chart points an Endpoints object at the operator.
                "--enable-aggregator-routing=true",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={workdir / 'audit.log'}",
            ],
        )
        wait_until(lambda: _ready(cp), timeout=60, what="kube-apiserver /readyz")
        cp.install_crds(crds)
        if start_controller_manager:
            _spawn(
                cp,
                "kube-controller-manager",
                [
                    str(binaries / "kube-controller-manager"),
                    f"--kubeconfig={kubeconfig}",
                    f"--controllers={controllers}",
                    f"--service-account-private-key-file={workdir / 'sa.key'}",
                    f"--root-ca-file={workdir / 'certs' / 'apiserver.crt'}",
                    "--use-service-account-credentials=false",
                    "--leader-elect=false",
                    "--port=0",
                    "--secure-port=0",
                ],
            )
    except BaseException:
        tails = "\n".join(f"--- {name}\n{cp.log_tail(name)}" for name in list(cp.processes))
        cp.stop()
        raise RuntimeError(f"the envtest control plane did not start:\n{tails}") from None
    return cp


def _ready(cp: ControlPlane) -> bool:
    for name, process in cp.processes.items():
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{cp.log_tail(name)}")
    try:
        request = urllib.request.Request(cp.server + "/readyz", headers={"Authorization": f"Bearer {cp.token}"})
        # Not verified: this only polls for readiness, possibly before --cert-dir holds the certificate.
        with urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=5) as response:
            return bool(response.read() == b"ok")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A control plane for the test session with the RLJob CRD and the fake KubeRay CRDs; KUBECONFIG points at it."""
    cp = start_control_plane([RLJOB_CRD, *FAKE_KUBERAY_CRDS])
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cp.kubeconfig)
    try:
        yield cp
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        cp.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own (`op-<test>-<random>`), deleted afterwards."""
    stem = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    name = f"op-{stem}-{secrets.token_hex(3)}"
    control_plane.request(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    with contextlib.suppress(urllib.error.HTTPError):
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")
