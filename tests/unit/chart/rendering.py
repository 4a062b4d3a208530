"""Render charts/kuberl with Helm's own template engine (helm-python-sdk binds Helm's Go SDK; no binary).

`render(values)` returns the objects `helm install` would send, parsed, in template order; the
helpers below pick them by kind. Tests that need the engine call `pytest.importorskip("helm_python")`
first, so the suite skips them where the package is not installed.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

CHART = REPO / "charts" / "kuberl"
RELEASE = "kuberl"
RELEASE_NAMESPACE = "kuberl-system"


#: KubeRay's namespace, a value every install must give (`kuberay.namespace`); `render` adds it unless a test does.
KUBERAY_NAMESPACE = "kuberay-system"


def render(
    values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = RELEASE_NAMESPACE
) -> list[dict[str, Any]]:
    """Every object of the chart's templates (not crds/) for these values, as `helm install` renders them; with
    `kuberay.namespace`, which the chart requires, set to KUBERAY_NAMESPACE unless the values set it."""
    import helm_python

    values = dict(values or {})
    values["kuberay"] = {"namespace": KUBERAY_NAMESPACE, **(values.get("kuberay") or {})}
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=name, namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for path in sorted(manifests):
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        objects.extend(document for document in yaml.safe_load_all(manifests[path]) if document)
    return objects


def of_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of `kind` (and `name`); fails listing what there is otherwise."""
    found = [obj for obj in of_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_container(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The literal env entries (name -> value) of a container."""
    return {entry["name"]: entry["value"] for entry in container.get("env", []) if "value" in entry}


def rbac_rules(objects: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(role, rule) for every rule of every Role and ClusterRole."""
    return [(role, rule) for role in objects if role["kind"] in ("Role", "ClusterRole") for rule in role["rules"]]


def crd_files() -> list[Path]:
    return sorted((CHART / "crds").glob("*.yaml"))
