"""The GPU runtime image's Python layer resolves against its base (docker/Dockerfile.runtime, step 2).

The build installs docker/requirements.py's output for the `runtime` extra, minus torch, with the base
image's packages as constraints; here pip resolves exactly that (`pip install --dry-run`) for the base's
Python and platform against the committed approximation of its packages (tests/integration/images/gpu_base.py).
Network: PyPI.
"""

import re
import subprocess
import sys
from subprocess import CalledProcessError

import pytest

from tests.conftest import REPO
from tests.integration.images import gpu_base

pytestmark = pytest.mark.integration

DOCKERFILE = REPO / "docker" / "Dockerfile.runtime"


def layer_requirements() -> list[str]:
    """What the Dockerfile's `requirements` stage writes, computed the same way."""
    command = [sys.executable, "docker/requirements.py", "pyproject.toml", "runtime", "--exclude", "torch"]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")[:-1]


def test_the_package_list_describes_the_dockerfiles_base():
    (default_base,) = re.findall(r"^ARG VLLM_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert default_base == gpu_base.BASE_IMAGE, (
        "update gpu_base.py, then run python -m tests.integration.images.gpu_base"
    )
    assert gpu_base.BASE_IMAGE in gpu_base.PACKAGES_FILE.read_text().splitlines()[0]


def test_the_runtime_requirements_resolve_beside_the_vllm_images_packages():
    requirements = layer_requirements()
    assert not [req for req in requirements if req.startswith("torch")], "torch must stay the base's"
    try:
        report = gpu_base.dry_run(requirements, constraints=gpu_base.base_packages())
    except CalledProcessError as error:
        pytest.fail(f"pip cannot install the runtime's requirements into {gpu_base.BASE_IMAGE}:\n{error.stderr}")
    resolved = dict(line.split("==") for line in gpu_base.pinned(report))
    base = dict(line.split("==") for line in gpu_base.base_packages())
    moved = {name: (base[name], version) for name, version in resolved.items() if base.get(name, version) != version}
    assert moved == {}, "the layer would replace packages of the base"
    assert {"ray", "peft", "tensorboard"} <= resolved.keys()


def test_a_requirement_the_base_cannot_meet_fails_the_resolution():
    """The check can fail: numpy below 2 against the base's numpy 2 is refused, as the image build would be."""
    with pytest.raises(CalledProcessError) as refused:
        gpu_base.dry_run([*layer_requirements(), "numpy<2"], constraints=gpu_base.base_packages())
    assert "numpy" in refused.value.stderr
