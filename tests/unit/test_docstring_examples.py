"""Every example in a docstring runs and prints what it shows (STYLE.md: "a docstring's example is real").

Each module of api/, operator/, runtime/ and kuberl/ whose source holds a `>>>` example is run with doctest;
a module added with an example is picked up by the scan, not by a list kept here.
"""

import doctest
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO

#: The folders of the `kuberl.*` packages (pyproject.toml's package-dir).
PACKAGES = {"api": "kuberl.api", "operator": "kuberl.operator", "runtime": "kuberl.runtime", "kuberl": "kuberl"}


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(REPO).with_suffix("").parts
    return ".".join([PACKAGES[folder], *(part for part in rest if part != "__init__")])


def modules_with_examples() -> list[str]:
    paths = (path for folder in PACKAGES for path in sorted((REPO / folder).rglob("*.py")))
    return [module_name(path) for path in paths if ">>>" in path.read_text()]


def test_the_scan_finds_the_examples_it_must_run() -> None:
    found = modules_with_examples()
    assert {"kuberl.runtime.algorithms.shaping", "kuberl.api.contract", "kuberl.verl.convert"} <= set(found)


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_docstring_examples_of(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} holds '>>>' but doctest found no example in a docstring"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (see above)"
