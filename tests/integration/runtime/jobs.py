"""RLJobs for runtime tests: the demo manifest with a few fields changed."""

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kuberl.api import RLJob, parse_rljob
from tests.conftest import REPO

DEMO = REPO / "examples" / "tiny-grpo.yaml"


def demo_job(**changes: object) -> RLJob:
    """The demo job with dotted-path changes, e.g. demo_job(**{"training.totalSteps": 5})."""
    manifest = yaml.safe_load(DEMO.read_text())
    apply_changes(manifest["spec"], changes)
    return parse_rljob(manifest)


def apply_changes(node: dict, changes: Mapping[str, object]) -> None:
    """Set each dotted path of `changes` below `node` (a copy of its value); a value of None removes the field."""
    for dotted, value in changes.items():
        parent = node
        *parents, leaf = dotted.split(".")
        for part in parents:
            parent = parent.setdefault(part, {})
        if value is None:
            parent.pop(leaf, None)
        else:
            parent[leaf] = copy.deepcopy(value)


def demo_base_dir() -> Path:
    return DEMO.parent


def worker_in_this_process(changes: Mapping[str, object]) -> Any:
    """A model worker built in this process (rank 0 of 1, on the CPU) for the minimal job with `changes`
    (tests/unit/api `spec_with`), to build its trainers (`_trainer`) without Ray or a setup call."""
    import torch

    from kuberl.runtime.workers.model_worker import ModelWorker
    from tests.unit.api.test_rules import spec_with

    worker = ModelWorker(rank=0, world_size=1)
    worker.job = parse_rljob(spec_with(dict(changes)))
    worker.device = torch.device("cpu")
    return worker
