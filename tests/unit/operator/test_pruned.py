"""Typos the API server dropped: found by comparing the last applied configuration with the stored RLJob."""

import json
from typing import Any

from kuberl.operator.decide import decide
from kuberl.operator.pruned import LAST_APPLIED, pruned_fields
from tests.unit.operator.conftest import SETTINGS, World, at, base_spec, make_rljob


def applied(rljob: dict[str, Any], sent_spec: dict[str, Any]) -> dict[str, Any]:
    """`rljob` as stored after `kubectl apply` of a manifest whose spec was `sent_spec`."""
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "tiny-grpo"}}
    rljob["metadata"]["annotations"] = {LAST_APPLIED: json.dumps({**manifest, "spec": sent_spec})}
    return rljob


def test_a_field_in_the_applied_manifest_but_not_in_the_stored_job_was_dropped():
    sent = {**base_spec(), "algorithm": {"groupsize": 4, "name": "grpo"}, "rewardd": {"function": "x"}}
    stored = {**base_spec(), "algorithm": {"name": "grpo"}}  # what the API server kept
    assert pruned_fields(applied(make_rljob(stored), sent)) == ["spec.algorithm.groupsize", "spec.rewardd"]


def test_lists_are_compared_item_by_item():
    sent = {**base_spec(), "env": [{"name": "A", "value": "1"}, {"name": "B", "valu": "2"}]}
    stored = {**base_spec(), "env": [{"name": "A", "value": "1"}, {"name": "B"}]}
    assert pruned_fields(applied(make_rljob(stored), sent)) == ["spec.env[1].valu"]


def test_nothing_is_reported_without_a_last_applied_configuration_or_when_all_was_kept():
    assert pruned_fields(make_rljob()) == []
    assert pruned_fields(applied(make_rljob(), base_spec())) == []
    broken = make_rljob()
    broken["metadata"]["annotations"] = {LAST_APPLIED: "{not json"}
    assert pruned_fields(broken) == []


def test_a_dropped_field_is_an_unknown_fields_condition_with_a_warning_until_the_manifest_is_fixed():
    sent = {**base_spec(), "algorithm": {"groupsize": 4}}
    world = World(rljob=applied(make_rljob({**base_spec(), "algorithm": {}}), sent))
    decision = world.step(at(0))
    condition = world.condition("UnknownFields")
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", "FieldsPruned")
    assert "spec.algorithm.groupsize" in condition["message"] and "kuberl validate" in condition["message"]
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "FieldsPruned")]
    assert world.rayjobs  # it is a warning: the job runs (with the defaults), as the API server stored it
    applied(world.rljob, {**base_spec(), "algorithm": {"groupSize": 4}})  # fixed and applied again
    world.rljob["spec"]["algorithm"] = {"groupSize": 4}
    world.step(at(5))
    assert world.condition("UnknownFields")["status"] == "False"
    later = decide(world.observed(), at(6), SETTINGS)
    assert not [e for e in later.events if e.reason in ("FieldsPruned", "NoFieldsPruned")]  # no event again
