"""Fields the API server dropped from an RLJob: a typo such as `groupsize` that the job would run without.

The CRD keeps unknown fields now (api/crd.py), so the webhook refuses a typo for every client. An older CRD
made the API server prune them silently before the webhook or the operator saw the object, so the spec of a
job stored then cannot show them. What can: the configuration the user applied. `kubectl apply` (and Argo CD's
default client-side apply) keeps it in the annotation LAST_APPLIED; every field there that the stored spec
lacks was dropped. Pure: a function of the RLJob as read.
"""

import json
from collections.abc import Iterator
from typing import Any

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def pruned_fields(rljob: dict[str, Any]) -> list[str]:
    """Field paths (`spec.algorithm.groupsize`) in the last applied configuration that the stored RLJob lacks."""
    text = ((rljob.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not text:
        return []
    try:
        applied = json.loads(text)
    except ValueError:
        return []
    if not isinstance(applied, dict):
        return []
    return list(_missing(applied.get("spec"), rljob.get("spec"), "spec"))


def _missing(applied: Any, stored: Any, path: str) -> Iterator[str]:
    if isinstance(applied, dict) and isinstance(stored, dict):
        for key, value in applied.items():
            if key not in stored:
                if value is not None:  # a null the schema does not allow is dropped too, but loses nothing
                    yield f"{path}.{key}"
            else:
                yield from _missing(value, stored[key], f"{path}.{key}")
    elif isinstance(applied, list) and isinstance(stored, list) and len(applied) == len(stored):
        for index, (item, kept) in enumerate(zip(applied, stored, strict=True)):
            yield from _missing(item, kept, f"{path}[{index}]")
