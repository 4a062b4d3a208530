"""The chart's metadata and values file: versions in step with the package, every value documented."""

import re
import tomllib
from pathlib import Path

import yaml

from kuberl import __version__
from tests.conftest import REPO
from tests.unit.chart.rendering import CHART

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):")


def documented_paths(values_file: Path) -> set[tuple[str, ...]]:
    """Key paths whose line has a comment block right above it that starts a `# --` description (helm-docs)."""
    documented: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    for line in values_file.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = KEY_LINE.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match["key"]))
            if any(comment.startswith("# --") for comment in comments):
                documented.add(tuple(key for _, key in stack))
        comments = []
    return documented


def leaf_paths(values: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the values a user sets: scalars, lists and empty mappings."""
    if isinstance(values, dict) and values:
        return [path for key, value in values.items() for path in leaf_paths(value, (*prefix, str(key)))]
    return [prefix]


def test_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == package == __version__


def test_every_value_has_a_doc_comment():
    values_file = CHART / "values.yaml"
    documented = documented_paths(values_file)
    undocumented = [
        ".".join(path)
        for path in leaf_paths(yaml.safe_load(values_file.read_text()))
        if not any(path[:length] in documented for length in range(1, len(path) + 1))
    ]
    assert undocumented == [], "give these values a `# --` comment in charts/kuberl/values.yaml"


def test_argocd_cm_snippet_holds_the_health_check_file():
    snippet = yaml.safe_load((CHART / "argocd" / "argocd-cm.yaml").read_text())
    lua = (CHART / "argocd" / "rljob-health.lua").read_text()
    assert snippet["metadata"]["name"] == "argocd-cm"
    assert snippet["data"]["resource.customizations.health.kuberl.io_RLJob"] == lua
