"""Writes api/kuberay_pod_template.json: the shape KubeRay's RayJob CRD gives a pod template, for api/pod_template.py.

    git -C <kuberay checkout> show v1.6.2:ray-operator/config/crd/bases/ray.io_rayjobs.yaml > /tmp/rayjobs.yaml
    .venv/bin/python hack/kuberay_pod_template.py /tmp/rayjobs.yaml v1.6.2

A role's `podTemplate` ends up, merged over kuberl's own template, as `spec.rayClusterSpec.headGroupSpec.template`
or a worker group's `template` of the RayJob, and the API server holds it to this schema there (the head's and
the workers' are the same; checked here). Only what says what a value may be is kept: types, properties, items,
map values, int-or-string, enums, patterns, list keys. Descriptions, defaults and formats go; a node with
properties that occurs more than once (a container, a probe, a label selector) is written once under `defs`,
named by where it first occurs, and referred to by {"ref": name}.
"""

import json
import sys
from pathlib import Path
from typing import Any

import yaml

OUTPUT = Path(__file__).resolve().parent.parent / "api" / "kuberay_pod_template.json"
KEPT = (
    "type",
    "enum",
    "pattern",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-map-keys",
)


def templates(crd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head's and a worker group's pod template schema in a RayJob CRD."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    cluster = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rayClusterSpec"]
    head = cluster["properties"]["headGroupSpec"]["properties"]["template"]
    worker = cluster["properties"]["workerGroupSpecs"]["items"]["properties"]["template"]
    return head, worker


def compact(node: dict[str, Any]) -> dict[str, Any]:
    out = {key: node[key] for key in KEPT if key in node}
    if "properties" in node:
        out["properties"] = {name: compact(sub) for name, sub in node["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            out[key] = compact(node[key])
    return out


def shared(root: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """`root` with every object node that occurs more than once replaced by a reference into the returned defs."""
    counts: dict[str, int] = {}

    def count(node: dict[str, Any]) -> None:
        if "properties" in node:
            key = json.dumps(node, sort_keys=True)
            counts[key] = counts.get(key, 0) + 1
        for sub in children(node):
            count(sub)

    count(root)
    defs: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}

    def replace(node: dict[str, Any], path: str) -> dict[str, Any]:
        key = json.dumps(node, sort_keys=True)
        out = dict(node)
        if "properties" in node:
            out["properties"] = {name: replace(sub, f"{path}.{name}") for name, sub in node["properties"].items()}
        for part, suffix in (("items", "[]"), ("additionalProperties", "{}")):
            if isinstance(node.get(part), dict):
                out[part] = replace(node[part], path + suffix)
        if counts.get(key, 0) < 2:
            return out
        if key not in names:
            names[key] = path
            defs[path] = out
        return {"ref": names[key]}

    return replace(root, "template"), defs


def children(node: dict[str, Any]) -> list[dict[str, Any]]:
    subs = list(node.get("properties", {}).values())
    subs += [node[key] for key in ("items", "additionalProperties") if isinstance(node.get(key), dict)]
    return subs


def main(crd_file: str, version: str) -> None:
    head, worker = templates(yaml.safe_load(Path(crd_file).read_text()))
    if compact(head) != compact(worker):
        raise SystemExit("the head's and the workers' pod template schemas differ; api/pod_template.py assumes one")
    root, defs = shared(compact(head))
    document = {
        "source": f"ray-project/kuberay {version} ray-operator/config/crd/bases/ray.io_rayjobs.yaml, "
        "spec.rayClusterSpec.headGroupSpec.template (written by hack/kuberay_pod_template.py)",
        "root": root,
        "defs": defs,
    }
    OUTPUT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"{OUTPUT}: {len(defs)} shared nodes, {OUTPUT.stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
