"""Quantities and the pod-template merge."""

import pytest

from kuberl.api.resources import RoleResources
from kuberl.operator.pods import container_resources, cpu_quantity, merge


@pytest.mark.parametrize(("cpus", "quantity"), [(1.0, "1"), (32, "32"), (0.5, "500m"), (1.25, "1250m"), (0.1, "100m")])
def test_cpu_quantity(cpus: float, quantity: str):
    assert cpu_quantity(cpus) == quantity


def test_memory_is_set_only_when_given():
    assert "memory" not in container_resources(RoleResources())["limits"]
    assert container_resources(RoleResources(memory="8Gi"))["limits"]["memory"] == "8Gi"


def test_mappings_merge_key_by_key_and_the_override_wins():
    assert merge({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 9}, "e": 5}) == {"a": 1, "b": {"c": 9, "d": 3}, "e": 5}


def test_named_lists_merge_by_name_and_append_new_names():
    base = [{"name": "x", "v": 1}, {"name": "y", "v": 2}]
    assert merge(base, [{"name": "y", "v": 20}, {"name": "z", "v": 3}]) == [
        {"name": "x", "v": 1},
        {"name": "y", "v": 20},
        {"name": "z", "v": 3},
    ]


def test_unnamed_lists_are_replaced():
    assert merge({"args": ["a", "b"]}, {"args": ["c"]}) == {"args": ["c"]}


def test_merge_changes_neither_argument():
    base, override = {"a": {"b": [{"name": "x"}]}}, {"a": {"b": [{"name": "x", "v": 1}]}}
    merge(base, override)
    assert base == {"a": {"b": [{"name": "x"}]}}
    assert override == {"a": {"b": [{"name": "x", "v": 1}]}}
