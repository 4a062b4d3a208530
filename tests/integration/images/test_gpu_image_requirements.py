"""The GPU runtime image's Python layer resolves against its base (docker/Dockerfile.runtime, step 2).

The build installs docker/requirements.py's output for the `runtime` extra, minus torch, with the base
image's packages as constraints; here pip resolves exactly that (`pip install --dry-run`) for the base's
Python and platform against the committed approximation of its packages (tests/integration/images/gpu_base.py).
Network: PyPI.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
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


def base_python() -> str | None:
    """A Python of the base image's version on this machine: one pyenv installed, else one on PATH (not pyenv's
    shim, which picks its Python by the name it is called by); None without one."""
    installed = sorted(Path.home().glob(f".pyenv/versions/{gpu_base.BASE_PYTHON}.*/bin/python{gpu_base.BASE_PYTHON}"))
    found = shutil.which(f"python{gpu_base.BASE_PYTHON}")
    return str(installed[-1]) if installed else found if found and "/shims/" not in found else None


def wheel_stage(dockerfile: str) -> tuple[str, list[tuple[str, str]], str]:
    """The Dockerfile's `wheel` stage: its WORKDIR, its COPYs (source, destination) and its RUN command, with the
    RUN's mount options left out."""
    stage = dockerfile.split(" AS wheel\n", 1)[1].split("\nFROM ", 1)[0]
    lines = stage.replace("\\\n", " ").splitlines()
    (workdir,) = [line.split()[1] for line in lines if line.startswith("WORKDIR ")]
    copies = [(origin, line.split()[-1]) for line in lines if line.startswith("COPY ") for origin in line.split()[1:-1]]
    (run,) = [line.removeprefix("RUN ").strip() for line in lines if line.startswith("RUN ")]
    return workdir, copies, re.sub(r"--mount=\S+\s+", "", run)


def test_the_wheel_stage_builds_kuberls_wheel_with_the_bases_python(tmp_path):
    """The stage runs pip in the folder the sources are copied to, which holds operator/. Run as `python3 -m pip`
    there, Python 3.12 (the base's) finds that folder before the standard library's `operator` and pip fails at
    its first import: the stage's command, run here as written with a Python of the base's version, must build
    the wheel."""
    python = base_python()
    if python is None:
        pytest.skip(f"no Python {gpu_base.BASE_PYTHON} on this machine (the base image's)")
    workdir, copies, command = wheel_stage(DOCKERFILE.read_text())
    assert workdir == "/src" and "/wheels" in command, command
    source = tmp_path / "src"
    for origin, destination in copies:  # as Docker copies: a folder's content to its destination, a file into a folder
        if (REPO / origin).is_dir():
            shutil.copytree(REPO / origin, source / destination)
        else:
            (source / destination).mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / origin, source / destination)
    assert (source / "operator" / "__init__.py").is_file()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(
        ["bash", "-c", command.replace("/wheels", str(tmp_path / "wheels"))],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{command}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert [wheel.name.split("-")[0] for wheel in (tmp_path / "wheels").glob("*.whl")] == ["kuberl"]
