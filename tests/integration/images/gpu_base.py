"""The GPU runtime image's base, as far as pip is concerned: its Python, its platform and its packages.

docker/Dockerfile.runtime installs kuberl's requirements into vllm/vllm-openai with the base's
`pip list --format=freeze` as constraints. That image cannot be pulled where the tests run, so its
package list is approximated once and committed (docker/runtime-gpu-base.txt): what pip resolves for
`vllm==0.32.0` from the packages on PyPI before vLLM 0.32.0's release, for the image's Python and
platform. The real image also holds what its Dockerfile adds for the OpenAI server (accelerate,
bitsandbytes, boto3 ...), which could only narrow the choices further, and whatever its own build
resolved on the day.

    python -m tests.integration.images.gpu_base      # rewrite docker/runtime-gpu-base.txt (network: PyPI)

pip 26.3 does the resolving, run from its wheel (cached beside the base image's cache): it filters
by upload time (--uploaded-prior-to) and resolves this package set in seconds where the venv's pip
backtracked for over ten minutes.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PACKAGES_FILE = REPO / "docker" / "runtime-gpu-base.txt"
#: docker/Dockerfile.runtime's default base, and what it holds.
BASE_IMAGE = "vllm/vllm-openai:v0.32.0"
BASE_REQUIREMENT = "vllm==0.32.0"
#: vLLM 0.32.0's wheels were uploaded to PyPI on 2026-10-18 (~10:04 UTC); the image was built from that day's index.
BASE_RELEASED = "2026-10-19T00:00:00Z"
#: vLLM's docker/Dockerfile: ARG PYTHON_VERSION=3.12 on nvidia/cuda's ubuntu22.04 images (glibc 2.35).
BASE_PYTHON = "3.12"
BASE_GLIBC_MINOR = 35
PIP_VERSION = "26.3"
#: pip settings of this process that do not change what pip resolves.
PIP_KEPT = ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK")
CACHE = Path(os.environ.get("KUBERL_IMAGES_CACHE", Path.home() / ".cache" / "kuberl" / "images"))


def platform_options() -> list[str]:
    """Every manylinux tag the base's glibc runs. pip does not widen a --platform to older manylinux versions,
    and the legacy aliases (manylinux2014 = 2_17, ...) are tags of their own (ray's wheels use one)."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(5, BASE_GLIBC_MINOR + 1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return [option for tag in tags for option in ("--platform", tag)]


def pip_wheel() -> Path:
    """pip PIP_VERSION's wheel, downloaded once with the venv's pip (a wheel of pip runs as `python <wheel>/pip`)."""
    wheel = CACHE / f"pip-{PIP_VERSION}-py3-none-any.whl"
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"pip=={PIP_VERSION}", "-d", str(CACHE)],
            env=pypi_environment(),
            check=True,
        )
    return wheel


def pypi_environment() -> dict[str, str]:
    """This process's environment without pip configuration of this machine (local indexes, find-links,
    constraints): the Dockerfile's pip sees PyPI only. Certificate settings stay (a TLS-inspecting proxy)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") or key in PIP_KEPT}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def dry_run(requirements: Sequence[str], constraints: Sequence[str] = (), uploaded_prior_to: str | None = None) -> Any:
    """`pip install --dry-run` of `requirements` for the base's Python and platform, binary wheels only (no
    compiler there either): pip's installation report, or a CalledProcessError carrying pip's explanation."""
    with tempfile.TemporaryDirectory(prefix="kuberl-gpu-pip-") as scratch:
        folder = Path(scratch)
        (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
        (folder / "constraints.txt").write_text("\n".join(constraints) + "\n")
        command = [sys.executable, str(pip_wheel() / "pip"), "install", "--dry-run", "--ignore-installed"]
        command += ["--quiet", "--report", str(folder / "report.json"), "--target", str(folder / "never-written")]
        command += ["--only-binary=:all:", "--implementation", "cp", "--python-version", BASE_PYTHON]
        command += [*platform_options(), "-r", str(folder / "requirements.txt"), "-c", str(folder / "constraints.txt")]
        if uploaded_prior_to:
            command += ["--uploaded-prior-to", uploaded_prior_to]
        subprocess.run(command, env=pypi_environment(), capture_output=True, text=True, check=True)
        return json.loads((folder / "report.json").read_text())


def pinned(report: Any) -> list[str]:
    """`name==version` of every package a report would install, sorted by name."""
    packages = sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in report["install"])
    return [f"{name}=={version}" for name, version in packages]


def base_packages() -> list[str]:
    """The committed approximation of the base image's `pip list --format=freeze`."""
    lines = PACKAGES_FILE.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def write_packages_file() -> None:
    report = dry_run([BASE_REQUIREMENT], uploaded_prior_to=BASE_RELEASED)
    header = (
        f"# {BASE_IMAGE}'s Python packages, approximated (tests/integration/images/gpu_base.py): pip {PIP_VERSION}'s\n"
        f"# resolution of {BASE_REQUIREMENT} for Python {BASE_PYTHON}, manylinux_2_{BASE_GLIBC_MINOR} x86_64, "
        f"from PyPI before {BASE_RELEASED}.\n"
        "# Regenerate with `python -m tests.integration.images.gpu_base` when Dockerfile.runtime's base changes.\n"
    )
    PACKAGES_FILE.write_text(header + "\n".join(pinned(report)) + "\n")


if __name__ == "__main__":
    write_packages_file()
