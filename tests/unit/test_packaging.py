"""The distribution ships every package, and the layers keep to their imports."""

import tomllib

from tests.conftest import REPO

FOLDERS = {"kuberl": "kuberl", "api": "kuberl.api", "operator": "kuberl.operator", "runtime": "kuberl.runtime"}


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *relative)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_api_imports_only_pydantic_and_yaml():
    import subprocess
    import sys

    code = "import sys, kuberl.api, kuberl.api.crd, kuberl.api.explain; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert not loaded & {"torch", "ray", "vllm", "kopf", "kubernetes", "transformers"}
