"""Shared fixtures. Integration fixtures (Ray, the API server) live beside the tests that use them."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def minimal_manifest() -> dict:
    """The smallest valid RLJob: an actor model, a data source and a reward."""
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "minimal"},
        "spec": {
            "models": {"actor": {"path": "/models/actor"}},
            "data": {"train": "/data/train.jsonl"},
            "reward": {"function": "math_exact"},
        },
    }
