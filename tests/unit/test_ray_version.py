"""Ray's token authentication needs Ray 2.52: the floor of the package, of the images and of the operator's setting.

Every job's Ray cluster asks KubeRay for token authentication; a Ray older than the floor ignores RAY_AUTH_MODE
and serves its dashboard and Jobs API to anyone on the pod network, while the RayJob claims the chart's version.
The images cannot be built here (no Docker engine): their check, docker/check-ray-version.py, runs here against
a stand-in `ray` package of each version.
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kuberl.api.contract import TOKEN_AUTH_RAY_VERSION
from kuberl.operator.builders import DEFAULT_RAY_VERSION
from kuberl.operator.settings import OperatorSettings
from tests.conftest import REPO
from tests.unit.operator.conftest import REQUIRED_ENV

FLOOR = ".".join(map(str, TOKEN_AUTH_RAY_VERSION))
CHECK = REPO / "docker" / "check-ray-version.py"


def test_the_runtime_extra_requires_a_ray_with_token_authentication():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["runtime"]
    (ray,) = [requirement for requirement in extra if requirement.startswith("ray[")]
    assert ray == f"ray[default]>={FLOOR.removesuffix('.0')}"


def run_check(tmp_path: Path, version: str, *expected: str) -> subprocess.CompletedProcess[str]:
    """docker/check-ray-version.py, as an image build runs it, with a stand-in `ray` of `version` first on the path."""
    path = tmp_path / version  # a folder per version: no stale bytecode of another one
    (path / "ray").mkdir(parents=True, exist_ok=True)
    (path / "ray" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return subprocess.run(
        [sys.executable, str(CHECK), *expected],
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(("version", "passes"), [("2.51.1", False), ("2.40.0", False), (FLOOR, True), ("2.60.0", True)])
def test_an_image_build_fails_on_a_ray_without_token_authentication(tmp_path: Path, version: str, passes: bool):
    result = run_check(tmp_path, version)
    assert (result.returncode == 0) is passes, result.stderr
    if not passes:
        assert f"ray {version} has no token authentication ({FLOOR} or later)" in result.stderr


def test_the_cpu_image_build_fails_on_a_ray_other_than_the_one_it_promises(tmp_path: Path):
    assert run_check(tmp_path, "2.61.0", "2.60.0").returncode == 1
    assert run_check(tmp_path, "2.60.0", "2.60.0").returncode == 0


def test_both_images_run_the_check_and_the_cpu_image_carries_the_charts_ray():
    gpu = (REPO / "docker" / "Dockerfile.runtime").read_text()
    cpu = (REPO / "docker" / "Dockerfile.runtime-cpu").read_text()
    assert "python3 /tmp/check-ray-version.py \\" in gpu
    assert 'python /tmp/check-ray-version.py "${RAY_VERSION}"' in cpu
    (pinned,) = re.findall(r"^ARG RAY_VERSION=(\S+)$", cpu, re.MULTILINE)
    chart = yaml.safe_load((REPO / "charts" / "kuberl" / "values.yaml").read_text())["runtime"]["rayVersion"]
    assert pinned == chart == DEFAULT_RAY_VERSION


@pytest.mark.parametrize("version", ["2.51.1", "2.9", "latest"])
def test_the_operator_does_not_start_with_a_ray_version_without_token_authentication(version: str):
    with pytest.raises(ValueError, match=rf"KUBERL_RAY_VERSION \('{re.escape(version)}'\) must be .* {FLOOR} or later"):
        OperatorSettings.from_env({**REQUIRED_ENV, "KUBERL_RAY_VERSION": version})
    assert OperatorSettings.from_env({**REQUIRED_ENV, "KUBERL_RAY_VERSION": FLOOR}).ray_version == FLOOR
