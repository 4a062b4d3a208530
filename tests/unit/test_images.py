"""kuberl's images without building them: the names `make images` gives them, the requirements their layers
install, and the record that `make test-images` passed on the images' current inputs (hack/images/inputs.py)."""

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import yaml

from tests.conftest import REPO

BUILD = REPO / "hack" / "images" / "build.sh"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


inputs = load(REPO / "hack" / "images" / "inputs.py")
requirements = load(REPO / "docker" / "requirements.py")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def build_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """hack/images/build.sh with `env` over an environment holding none of its variables."""
    own = ("IMAGES", "IMAGE_REGISTRY", "IMAGE_TAG", "PYTHON_IMAGE", "TORCH_WHEELS", "TORCH_INDEX_URL", "CA_BUNDLE")
    base = {key: value for key, value in os.environ.items() if key not in own}
    return subprocess.run([str(BUILD), *args], env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_make_test_images_passed_on_the_images_current_inputs() -> None:
    done = subprocess.run([sys.executable, "hack/images/inputs.py", "check"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_default_image_names_are_those_the_chart_and_the_cluster_example_pull() -> None:
    names = build_script("names", IMAGES="operator runtime-cpu runtime").stdout.split()
    chart = yaml.safe_load((REPO / "charts" / "kuberl" / "values.yaml").read_text())
    version = yaml.safe_load((REPO / "charts" / "kuberl" / "Chart.yaml").read_text())["appVersion"]
    example = yaml.safe_load((REPO / "examples" / "tiny-grpo-cluster.yaml").read_text())
    assert names == [
        f"{chart['operator']['image']['repository']}:{version}",
        example["spec"]["image"],
        f"{chart['runtime']['image']['repository']}:{version}",
    ]


def test_image_registry_and_tag_name_the_images() -> None:
    done = build_script("names", IMAGE_REGISTRY="registry.example.com/ml", IMAGE_TAG="7")
    assert done.stdout.split() == ["registry.example.com/ml/operator:7", "registry.example.com/ml/runtime:7-cpu"]


def test_an_unknown_image_is_refused_before_anything_is_built() -> None:
    done = build_script("build", IMAGES="operator gpu")
    assert done.returncode == 2
    assert "unknown image 'gpu'" in done.stderr and "operator runtime-cpu runtime" in done.stderr


def test_a_torch_wheel_folder_without_torch_is_refused(tmp_path: Path) -> None:
    done = build_script("build", TORCH_WHEELS=str(tmp_path))
    assert done.returncode == 2
    assert f"TORCH_WHEELS={tmp_path} holds no torch-*.whl" in done.stderr


def test_the_operator_layer_installs_the_projects_and_the_operator_extras_requirements() -> None:
    project = PYPROJECT["project"]
    wanted = requirements.requirements(REPO / "pyproject.toml", ["operator"], set())
    assert wanted == [*project["dependencies"], *project["optional-dependencies"]["operator"]]


def test_the_runtime_layer_leaves_torch_to_what_installs_it_first() -> None:
    wanted = requirements.requirements(REPO / "pyproject.toml", ["runtime"], {"torch"})
    names = [requirements.distribution_name(req) for req in wanted]
    assert "torch" not in names and "ray" in names and "pydantic" in names


def test_an_unknown_extra_is_refused_naming_the_known_ones() -> None:
    done = subprocess.run(
        [sys.executable, "docker/requirements.py", "pyproject.toml", "gpu"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "no extra ['gpu']" in done.stderr and "'runtime'" in done.stderr


def test_requirement_names_are_compared_as_pip_compares_them() -> None:
    assert requirements.distribution_name("Ray[default]>=2.40") == "ray"
    assert requirements.distribution_name("mlflow_skinny>=2.20") == "mlflow-skinny"


def test_the_record_ignores_the_settings_no_image_uses() -> None:
    changed = tomllib.loads((REPO / "pyproject.toml").read_text())
    changed["project"]["optional-dependencies"]["dev"].append("a-new-linter")
    changed["tool"]["ruff"]["line-length"] = 100
    assert inputs.pyproject_part(changed) == inputs.pyproject_part(PYPROJECT)
    changed["project"]["optional-dependencies"]["runtime"].append("a-new-runtime-library")
    assert inputs.pyproject_part(changed) != inputs.pyproject_part(PYPROJECT)


def test_a_stale_record_names_what_changed() -> None:
    recorded = {"docker/Dockerfile.operator": "a", "docker/old.sh": "b", "pyproject.toml [...]": "c"}
    current = {"docker/Dockerfile.operator": "a2", "docker/new.sh": "d", "pyproject.toml [...]": "c"}
    assert inputs.changes(recorded, current) == [
        "changed: docker/Dockerfile.operator",
        "new: docker/new.sh",
        "removed: docker/old.sh",
    ]
    assert inputs.parse(inputs.render(current)) == current
