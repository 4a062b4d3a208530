"""A role's `podTemplate` held to the shape KubeRay's RayJob CRD gives a pod template, with each problem's path.

The operator merges a `podTemplate` over the pod template it builds (operator/pods.py) and puts the result into
the RayJob, where the API server checks it against KubeRay's CRD. Before, the RLJob accepted any mapping there:
`spec: "x"`, `containers: [1.5]` or a mount path that is a number passed `kuberl validate` and then crashed the
webhook, `kuberl validate --cluster` and every reconcile pass (which read and merge the template), or were
dropped or refused far from where they were written. So each value is checked here, at the door, against
api/kuberay_pod_template.json: KubeRay v1.6.2's schema of `headGroupSpec.template` (the same as a worker
group's), written by hack/kuberay_pod_template.py. What is checked:

- every value has the type the schema gives it (a string, an integer, an int-or-string quantity, a list, a
  mapping), and a string its enum and pattern (a resource quantity such as `16Gi`); null is no value;
- every key is a field of its object: one KubeRay's CRD does not know would be dropped without a word, as a typo;
- every item of a list Kubernetes keys by name (containers, env, volumes ...) has a name, and no name twice: the
  operator merges such a list into its own item by item by name.

Not checked: fields Kubernetes requires besides those names. The template is partial, its items merge into the
operator's (a volumeMount of `kuberl-checkpoints` may give only `readOnly`), so the API server judges the merged
pod when the RayJob is created, and a refusal shows as Created=False with its words.
"""

import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The compact schema: {"root": node, "defs": {name: node}}; a node {"ref": name} stands for defs[name].
SCHEMA: dict[str, Any] = json.loads((Path(__file__).parent / "kuberay_pod_template.json").read_text())

Path_ = tuple[str | int, ...]
Problem = tuple[Path_, str]


def pod_template_problems(template: Any) -> list[Problem]:
    """Every way `template` does not fit a pod template, each with its path inside the template."""
    return list(_check(template, SCHEMA["root"], ()))


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    return SCHEMA["defs"][node["ref"]] if "ref" in node else node


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({_shown(value)})"
    if isinstance(value, str):
        return f"a string ({_shown(value)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"{type(value).__name__} ({_shown(value)})"


EXPECTED = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


def _check(value: Any, node: dict[str, Any], path: Path_) -> Iterator[Problem]:
    node = _resolved(node)
    if value is None:
        yield path, "null is not a value here; leave the field out"
        return
    if node.get("x-kubernetes-int-or-string"):
        yield from _int_or_string(value, node, path)
        return
    kind = node.get("type")
    if kind == "object":
        yield from _object(value, node, path)
    elif kind == "array":
        yield from _array(value, node, path)
    elif kind is not None and not _has_type(value, kind):
        yield path, f"expected {EXPECTED[kind]}, found {_kind(value)}"
    elif kind == "string":
        yield from _string(value, node, path)


def _has_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def _int_or_string(value: Any, node: dict[str, Any], path: Path_) -> Iterator[Problem]:
    if isinstance(value, str):
        yield from _string(value, node, path)
    elif not _has_type(value, "integer"):
        yield path, f"expected an integer or a string, found {_kind(value)}"


def _string(value: str, node: dict[str, Any], path: Path_) -> Iterator[Problem]:
    if "enum" in node and value not in node["enum"]:
        yield path, f"{_shown(value)} is not one of {', '.join(node['enum'])}"
    elif "pattern" in node and not re.search(node["pattern"], value):
        yield path, f"{_shown(value)} is not in the form Kubernetes expects here (a quantity such as 500m or 16Gi)"


def _object(value: Any, node: dict[str, Any], path: Path_) -> Iterator[Problem]:
    if not isinstance(value, dict):
        yield path, f"expected a mapping, found {_kind(value)}"
        return
    fields: dict[str, Any] = node.get("properties", {})
    values: dict[str, Any] | None = node.get("additionalProperties")
    for key, item in value.items():
        if not isinstance(key, str):
            yield (*path, str(key)), f"a key must be a string, found {_kind(key)}"
        elif key in fields:
            yield from _check(item, fields[key], (*path, key))
        elif values is not None:
            yield from _check(item, values, (*path, key))
        elif fields and not node.get("x-kubernetes-preserve-unknown-fields"):
            yield (*path, key), _unknown(key, fields)


def _unknown(key: str, fields: dict[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(fields), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"unknown field{hint}: not in the pod template KubeRay's RayJob takes, where it would be dropped; "
        f"known fields here: {', '.join(sorted(fields))}"
    )


def _array(value: Any, node: dict[str, Any], path: Path_) -> Iterator[Problem]:
    if not isinstance(value, list):
        yield path, f"expected a list, found {_kind(value)}"
        return
    for index, item in enumerate(value):
        yield from _check(item, node.get("items", {}), (*path, index))
    if node.get("x-kubernetes-list-map-keys") == ["name"]:
        yield from _named_items(value, path)


def _named_items(items: list[Any], path: Path_) -> Iterator[Problem]:
    """Items of a list keyed by name: each names itself, once (the operator merges them into its own by name)."""
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue  # already reported as not a mapping
        name = item.get("name")
        if name is None:
            yield (*path, index), "needs a name: the items of this list are told apart (and merged) by name"
        elif isinstance(name, str) and name in seen:
            yield (*path, index, "name"), f"{name!r} is already the name of item [{seen[name]}]"
        elif isinstance(name, str):
            seen[name] = index
