"""Every examples/*.yaml passes `kubectl apply --dry-run=server` against the chart's CRD.

A server-side dry run is a create with dryRun=All: the API server runs the CRD's schema, defaulting
and admission (any registered webhook included) and stores nothing. A manifest without a namespace
goes to a namespace of the test's own; one that names its namespace (`research`) goes there, as
with kubectl, and the test creates that namespace if it is missing.
"""

import secrets
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.chart.conftest import admin_client, chart_crds, create_namespace, helm_install_crds
from tests.integration.envtest import ControlPlane

pytestmark = pytest.mark.integration

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def manifests(example: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(example.read_text()) if doc]


@pytest.fixture(scope="module")
def dry_run_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace for manifests without one; the namespaces examples name exist while the tests run."""
    helm_install_crds(admin_client(control_plane), chart_crds())
    own = f"chart-examples-{secrets.token_hex(3)}"
    documents = [doc for path in EXAMPLES for doc in manifests(path)]
    named = {doc["metadata"]["namespace"] for doc in documents if "namespace" in doc["metadata"]}
    created = []
    for name in [own, *sorted(named)]:
        try:
            create_namespace(control_plane, name)
        except urllib.error.HTTPError as error:
            if error.code != 409:
                raise
        else:
            created.append(name)
    yield own
    for name in created:
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_passes_a_server_side_dry_run(control_plane: ControlPlane, dry_run_namespace: str, example: Path):
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(control_plane.kubeconfig)))
    documents = manifests(example)
    assert documents, f"{example} holds no manifest"
    for manifest in documents:
        group, version = manifest["apiVersion"].split("/")
        namespace = manifest["metadata"].get("namespace", dry_run_namespace)
        answer = api.create_namespaced_custom_object(group, version, namespace, "rljobs", manifest, dry_run="All")
        assert answer["spec"]["models"]["actor"]["path"] == manifest["spec"]["models"]["actor"]["path"]
        stored = api.list_namespaced_custom_object(group, version, namespace, "rljobs")
        assert manifest["metadata"]["name"] not in {item["metadata"]["name"] for item in stored["items"]}
