"""RLJobs for runtime tests: the demo manifest with a few fields changed."""

import copy
from pathlib import Path

import yaml

from kuberl.api import RLJob, parse_rljob
from tests.conftest import REPO

DEMO = REPO / "examples" / "tiny-grpo.yaml"


def demo_job(**changes: object) -> RLJob:
    """The demo job with dotted-path changes, e.g. demo_job(**{"training.totalSteps": 5})."""
    manifest = yaml.safe_load(DEMO.read_text())
    for dotted, value in changes.items():
        node = manifest["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return parse_rljob(manifest)


def demo_base_dir() -> Path:
    return DEMO.parent
