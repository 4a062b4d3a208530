"""The whole loop on a real API server: the chart's operator on its own RBAC, and KubeRay and the kubelet played by
tests/integration/kuberay_standin.py, so an RLJob runs as it would on a cluster, every pod a filesystem of its own.

`loop` (module-scoped) installs the chart for one jobs namespace (`loop-jobs-*`), starts the stand-in for that
namespace, creates the claim examples/k8s/tiny-grpo-checkpoints.yaml there, and hands the test a `Loop` to
create RLJobs from the examples and read what a user would read back.
"""

import re
import secrets
import time
import urllib.error
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.operator import names
from tests.conftest import REPO
from tests.integration.chart.conftest import Installation, installed
from tests.integration.envtest import ControlPlane, control_plane, wait_until  # noqa: F401
from tests.integration.kuberay_standin import KubeRayStandIn
from tests.integration.runtime.jobs import apply_changes

pytestmark = pytest.mark.integration

CLAIM = REPO / "examples" / "k8s" / "tiny-grpo-checkpoints.yaml"
#: The loop tests' jobs: this many steps, a checkpoint every 2.
STEPS = 6
#: The demo's model, built in a second on each pod (tiny://counter, the example's, pretrains for 20-60 s per pod).
QUICK = {"spec.models.actor.path": "tiny://demo"}
CHECKPOINT_FOLDER = re.compile(r"^step-(\d+)$")
#: What `kubectl get` asks for: the server-side table with the CRD's printer columns.
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def example(file: str, **changes: object) -> dict[str, Any]:
    """An example manifest with dotted-path changes (from its top: `spec.training.totalSteps`); None removes one."""
    (manifest,) = [doc for doc in yaml.safe_load_all((REPO / "examples" / file).read_text()) if doc]
    apply_changes(manifest, changes)
    return dict(manifest)


def short(file: str, name: str, **changes: object) -> dict[str, Any]:
    """The example named `name`, for STEPS steps with a checkpoint every 2 and restarts without a wait."""
    return example(
        file,
        **{
            "metadata.name": name,
            "spec.training.totalSteps": STEPS,
            "spec.checkpoint.intervalSteps": 2,
            "spec.runPolicy.backoffSeconds": 0,
            **changes,
        },
    )


def committed_steps(job_folder: Path) -> list[int]:
    """The steps of the job's committed checkpoints on the claim (`step-N` with its COMPLETE marker)."""
    folder = job_folder / "checkpoints"
    found = [CHECKPOINT_FOLDER.match(child.name) for child in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m.group(1)) for m in found if m and (folder / m.group(0) / "COMPLETE").is_file())


def weights(model_folder: Path) -> dict[str, Any]:
    """The tensors of a Hugging Face model folder, by name."""
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(model_folder).state_dict())


@dataclass
class Loop:
    cp: ControlPlane
    namespace: str
    standin: KubeRayStandIn
    installation: Installation

    def create(self, manifest: dict[str, Any]) -> str:
        self.cp.request("POST", names.rljob_path(self.namespace), manifest)
        return str(manifest["metadata"]["name"])

    def rljob(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.cp.request("GET", names.rljob_path(self.namespace, name)))
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return {}
            raise

    def rayjobs(self, name: str) -> dict[str, dict[str, Any]]:
        """The RLJob's RayJobs by name (those being deleted too)."""
        items = self.cp.request("GET", f"{names.rayjob_path(self.namespace)}?labelSelector={names.JOB_LABEL}={name}")
        return {item["metadata"]["name"]: item for item in items["items"]}

    def wait_phase(self, name: str, phase: str, timeout: float) -> dict[str, Any]:
        """The RLJob's status once it reaches `phase` (a failed test shows `diagnosis()` of every job)."""
        return dict(
            wait_until(
                lambda: (self.rljob(name).get("status") or {}).get("phase") == phase and self.rljob(name)["status"],
                timeout=timeout,
                interval=0.5,
                what=f"RLJob {name} {phase}",
            )
        )

    def diagnosis(self, name: str, *, shared: bool = True) -> str:
        """The RLJob's status, its RayJobs' statuses and driver logs; with `shared`, what all jobs share too: the
        operator's warnings, the stand-in's problems and pod logs."""
        parts = [f"RLJob {name} status: {yaml.safe_dump(self.rljob(name).get('status'))}"]
        for rayjob, item in self.rayjobs(name).items():
            parts.append(f"RayJob {rayjob}: {item.get('status')}")
            parts.append(f"driver log of {rayjob}:\n{self.standin.driver_log(self.namespace, rayjob)[-6000:]}")
        if shared:
            parts.append(self.shared_diagnosis())
        return "\n".join(parts)

    def shared_diagnosis(self) -> str:
        parts = [
            "operator warnings:\n" + "\n".join(record.getMessage()[:1500] for record in self.installation.logs[-20:])
        ]
        parts.append("stand-in problems:\n" + "\n".join(self.standin.problems[-20:]))
        now = time.monotonic()
        for pod in self.standin.pods(self.namespace, ended_too=True):
            parts.append(f"pod {pod.name} ({pod.state(now)}):\n{pod.log.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def diagnosis_of_every_job(self) -> str:
        """`diagnosis()` of each RLJob of the namespace, and once what they share."""
        jobs = [item["metadata"]["name"] for item in self.cp.request("GET", names.rljob_path(self.namespace))["items"]]
        return "\n\n".join([*(self.diagnosis(job, shared=False) for job in jobs), self.shared_diagnosis()])

    def printed_row(self, name: str) -> dict[str, Any]:
        """`kubectl get rlj <name>`: the printer columns as the API server renders them, by column name."""
        table = self.cp.request("GET", names.rljob_path(self.namespace, name), accept=TABLE)
        columns = [column["name"] for column in table["columnDefinitions"]]
        (row,) = table["rows"]
        return dict(zip(columns, row["cells"], strict=True))

    def job_folder(self, name: str) -> Path:
        """The job's folder on the claim, `<claim>/<namespace>/<name>`, as seen from this machine."""
        return self.standin.claim_folder(self.namespace, "tiny-grpo-checkpoints") / self.namespace / name


@pytest.fixture(scope="module")
def loop(
    control_plane: ControlPlane,  # noqa: F811 - the fixture of that name
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Loop]:
    pytest.importorskip("helm_python", reason="rendering the chart needs helm-python-sdk (the dev extra)")
    suffix = secrets.token_hex(3)
    release_namespace, jobs_namespace = f"loop-rel-{suffix}", f"loop-jobs-{suffix}"
    values = {"rbac": {"scope": "namespace"}, "watchNamespaces": [jobs_namespace]}
    with installed(
        control_plane,
        values,
        release_namespace=release_namespace,
        jobs_namespace=jobs_namespace,
        folder=tmp_path_factory.mktemp("loop"),
        create_namespaces=(release_namespace, jobs_namespace),
    ) as installation:
        with KubeRayStandIn(control_plane, {jobs_namespace}) as standin:
            claim = yaml.safe_load(CLAIM.read_text())
            control_plane.request("POST", f"/api/v1/namespaces/{jobs_namespace}/persistentvolumeclaims", claim)
            yield Loop(control_plane, jobs_namespace, standin, installation)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A loop test that fails (in its fixtures too: some run the jobs) shows what every job and pod was doing."""
    report = yield
    loop = getattr(item, "funcargs", {}).get("loop")
    if report.failed and isinstance(loop, Loop):
        try:
            report.sections.append(("what the loop's jobs were doing", loop.diagnosis_of_every_job()))
        except Exception as error:  # noqa: BLE001 - the test's own failure is what counts
            report.sections.append(("what the loop's jobs were doing", f"could not be read: {error!r}"))
    return report
