"""The CRD is generated from the models, is structural, installs on old and new servers, and is current."""

import pytest
import yaml

from kuberl.api.crd import CRD_FILE_NAME, build_crd, render_crd_yaml
from tests.conftest import REPO


def walk(node, path="root"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            yield from walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def schema():
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("folder", ["crds", "charts/kuberl/crds"])
def test_committed_crd_is_current(folder):
    committed = (REPO / folder / CRD_FILE_NAME).read_text()
    assert committed == render_crd_yaml(), f"{folder}/{CRD_FILE_NAME} is stale: run `make crds` and commit it"


def test_schema_is_structural(schema):
    for path, node in walk(schema):
        for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "title", "$defs", "prefixItems"):
            assert forbidden not in node, f"{path} has {forbidden}"
        assert node.get("additionalProperties") is not False, f"{path}: additionalProperties: false"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be boolean in OpenAPI v3.0"


def test_unknown_fields_are_kept_for_the_webhook_to_refuse_them(schema):
    """Every object of the spec, and the root, keeps fields it does not know: the API server prunes only below a node
    that does not say so, and a pruned typo never reaches the webhook. The status stays pruned (the operator's)."""
    assert schema["x-kubernetes-preserve-unknown-fields"] is True
    objects = [(path, node) for path, node in walk(schema["properties"]["spec"], "spec") if "properties" in node]
    assert len(objects) > 20
    assert [path for path, node in objects if not node.get("x-kubernetes-preserve-unknown-fields")] == []
    status = schema["properties"]["status"]
    assert [path for path, node in walk(status, "status") if node.get("x-kubernetes-preserve-unknown-fields")] == []


def test_no_string_defaults_that_kubernetes_1_20_rejects(schema):
    for path, node in walk(schema):
        assert "default" not in node, f"{path} carries a default; defaults belong to the models"


def test_every_spec_and_status_field_has_a_description(schema):
    for section in ("spec", "status"):
        for path, node in walk(schema["properties"][section], section):
            if not path.endswith(("[]", "{}")):  # a list's scalar items are described by the list
                assert node.get("description"), f"{path} has no description"


def test_enums_and_bounds_reach_the_crd(schema):
    algorithm = schema["properties"]["spec"]["properties"]["algorithm"]["properties"]
    assert "grpo" in algorithm["name"]["enum"] and "ppo" in algorithm["name"]["enum"]
    assert algorithm["groupSize"]["minimum"] == 1
    phase = schema["properties"]["status"]["properties"]["phase"]
    assert set(phase["enum"]) == {
        "Pending",
        "Queued",
        "Starting",
        "Running",
        "Suspended",
        "Restarting",
        "Succeeded",
        "Failed",
    }


def test_required_fields_of_the_smallest_manifest(schema):
    assert set(schema["properties"]["spec"]["required"]) == {"models", "reward", "data"}


def test_resource_names_columns_and_status_subresource():
    crd = build_crd()
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("RLJob", "rljobs", ["rlj"])
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.progress.step",
        "Total": ".status.progress.totalSteps",
        "Reward": ".status.metrics.rewardMean",
        "Restarts": ".status.restarts",
        "Queue": ".spec.queueName",
        "Age": ".metadata.creationTimestamp",
    }


def test_rendered_yaml_parses_back_to_the_same_crd():
    assert yaml.safe_load(render_crd_yaml()) == build_crd()
