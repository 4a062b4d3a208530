"""kuberl's images, built once per session with `make images` (the README's command), under test names.

Run with `make test-images` (not part of `make test`: hack/images/inputs.py says why and when CI runs it).
`built_images` runs `make images IMAGE_REGISTRY=localhost/kuberl-test IMAGE_TAG=test` with the build
arguments of this machine:
- PYTHON_IMAGE as given, else the Debian base hack/images/base.sh builds once and caches (Docker Hub's
  python image is not reachable from every machine that runs this; it is the Dockerfiles' default);
- TORCH_WHEELS as given, else the folder pip's PIP_FIND_LINKS names when it holds torch's CPU wheel (where
  this machine's own torch comes from: PyTorch's index is unreachable here), else PyTorch's CPU index;
- CA_BUNDLE as make passes it ($PIP_CERT unless given).
The engine keeps the layers, so a session after a change to kuberl's code rebuilds only the last ones.
"""

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration

TEST_REGISTRY = "localhost/kuberl-test"
TEST_TAG = "test"
TORCH_WHEEL_GLOB = "torch-*+cpu-cp311-*.whl"


@dataclass(frozen=True)
class BuiltImages:
    engine: str
    operator: str
    runtime_cpu: str


def run_logged(command: list[str], env: dict[str, str], log: Path, timeout: float) -> None:
    """Run `command` with its output in `log`; on failure, the error names the command and ends with the log's tail."""
    with log.open("wb") as out:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-6000:]
        pytest.fail(f"{shlex.join(command)} failed ({done.returncode}); the end of its output ({log}):\n{tail}")


def python_image(log_dir: Path) -> str:
    given = os.environ.get("PYTHON_IMAGE")
    if given:
        return given
    log = log_dir / "base.log"
    run_logged(["hack/images/base.sh"], dict(os.environ), log, timeout=1800)
    return log.read_text().strip().splitlines()[-1]


def torch_wheels() -> str:
    """The folder torch's CPU wheel comes from, or "" for PyTorch's index (see the module docstring)."""
    given = os.environ.get("TORCH_WHEELS")
    if given:
        return given
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        if Path(folder).is_dir() and any(Path(folder).glob(TORCH_WHEEL_GLOB)):
            return folder
    return ""


def engine() -> str:
    done = subprocess.run(["hack/images/build.sh", "engine"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(done.stderr.strip())
    return done.stdout.strip()


@pytest.fixture(scope="session")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> BuiltImages:
    logs = tmp_path_factory.mktemp("image-build")
    env = {
        **os.environ,
        "PYTHON_IMAGE": python_image(logs),
        "TORCH_WHEELS": torch_wheels(),
    }
    # The build's time shows in --durations as the setup of the first test.
    names = [f"IMAGE_REGISTRY={TEST_REGISTRY}", f"IMAGE_TAG={TEST_TAG}"]
    command = ["make", "images", "IMAGES=operator runtime-cpu", *names]
    run_logged(command, env, logs / "build.log", timeout=3600)
    return BuiltImages(
        engine=engine(),
        operator=f"{TEST_REGISTRY}/operator:{TEST_TAG}",
        runtime_cpu=f"{TEST_REGISTRY}/runtime:{TEST_TAG}-cpu",
    )
