"""Every RLJob spec field is read by the code that acts on it: a field accepted and ignored is a bug.

The check walks every pydantic model under `RLJobSpec` and looks for each field's Python name as an
attribute read (`x.field_name`) in `runtime/`, `operator/` or `api/topology.py` (the pools and
placement both of them follow). It is a name check, so a field with a
common name (`name`, `path`) passes once anything of that name is read; it catches the field nobody
wired up, which is how `data.validation` and `training.validationEverySteps` went unread.
"""

import ast
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from kuberl.api.spec import RLJobSpec
from tests.conftest import REPO

#: Fields whose reader is the API itself, with the reason. Keep it short: everything else is read
#: where it takes effect.
READ_BY_THE_API = {
    # the operator and the runtime call RoleResources.effective_min / effective_max / is_elastic
    ("RoleResources", "min_replicas"): "read through RoleResources.effective_min and is_elastic",
    ("RoleResources", "max_replicas"): "read through RoleResources.effective_max and is_elastic",
    # the runtime's episode limits read RLJobSpec.max_turn_tokens (runtime/rollout/episodes.py)
    ("EnvironmentSpec", "max_tokens_per_turn"): "read through RLJobSpec.max_turn_tokens",
    # a toleration is copied whole into the pod spec (operator/builders.py: toleration.to_manifest())
    ("Toleration", "key"): "serialised whole into the pods by the operator",
    ("Toleration", "effect"): "serialised whole into the pods by the operator",
    ("Toleration", "toleration_seconds"): "serialised whole into the pods by the operator",
}


def spec_fields(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[tuple[str, str]]:
    """(model name, field name) of `model` and every model nested in it."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    found = set()
    for name, field in model.model_fields.items():
        found.add((model.__name__, name))
        for nested in nested_models(field.annotation):
            found |= spec_fields(nested, seen)
    return found


def nested_models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict, typing.Annotated):
        return [model for arg in typing.get_args(annotation) for model in nested_models(arg)]
    return []


#: Where a field takes effect: the runtime, the operator, and the topology both of them place by.
READERS = ("runtime", "operator", "api/topology.py")


def attributes_read(*places: str) -> set[str]:
    """Every `something.attribute` name that appears in the Python sources at `places` (folders or files)."""
    names: set[str] = set()
    for place in places:
        root = Path(REPO, place)
        for path in [root] if root.is_file() else root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
    return names


def test_every_spec_field_is_read_by_the_runtime_or_the_operator() -> None:
    read = attributes_read(*READERS)
    unread = sorted(
        f"{model}.{field}"
        for model, field in spec_fields(RLJobSpec)
        if field not in read and (model, field) not in READ_BY_THE_API
    )
    assert not unread, f"spec fields nothing reads (wire them up, or refuse them): {unread}"


def test_the_allow_list_holds_only_real_fields_nobody_else_reads() -> None:
    read = attributes_read(*READERS)
    fields = spec_fields(RLJobSpec)
    for model, field in READ_BY_THE_API:
        assert (model, field) in fields, f"{model}.{field} is no longer a spec field"
        assert field not in read, f"{model}.{field} is read now; take it off the allow-list"


def test_the_scan_sees_the_fields_this_issue_wired_up() -> None:
    read = attributes_read(*READERS)
    assert {"validation_every_steps", "validation", "policy_loss", "dynamic_sampling", "overlong_penalty"} <= read
    assert "a_field_nobody_reads" not in read
