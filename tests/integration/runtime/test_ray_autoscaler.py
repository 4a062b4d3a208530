"""Role pinning creates demand: a reward worker asks for `kuberl_reward`, so where no node offers it the
actor waits, and that pending actor is what makes the autoscaler add a node; a released worker leaves its
node idle for the autoscaler to remove. Shown with Ray's own autoscaler on its fake multi-node provider
(the autoscaler the KubeRay autoscaler runs), for a reward pool of minReplicas 0, maxReplicas 1 on a cluster
with no reward node.

The scenario runs in a child process (autoscaling_cluster.py) with its own Ray cluster, since the pytest
process may already hold the session's Ray; it prints what it saw as JSON.
"""

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.runtime.autoscaling_cluster import BURST

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}  # not the session's Ray
    env |= {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.integration.runtime.autoscaling_cluster"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"the autoscaling scenario failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def test_cluster_starts_with_no_reward_node(seen: dict[str, Any]) -> None:
    assert seen["nodes_at_start"] == 1  # the head only
    assert seen["reward_units_at_start"] == 0


def test_first_worker_brings_a_reward_node(seen: dict[str, Any]) -> None:
    assert seen["nodes_with_first_worker"] == 2


def test_idle_pool_releases_its_worker_and_the_node_goes(seen: dict[str, Any]) -> None:
    assert seen["pool_size_idle"] == 0
    assert seen["nodes_idle"] == 1
    assert seen["reward_units_idle"] == 0


def test_burst_on_an_empty_pool_brings_a_node_back_and_is_scored_once_each(seen: dict[str, Any]) -> None:
    assert seen["burst_peak_nodes"] == 2
    assert seen["burst_peak_reward_units"] == 1
    assert seen["errors"] == [None] * BURST
    assert seen["scores"] == [float(i) for i in range(BURST)]  # slow_score scores each sample by its index
    assert seen["metrics"]["reward/scale_ups"] >= 1
    assert seen["metrics"]["reward/duplicates_dropped"] == 0


def test_pool_and_cluster_shrink_back_to_no_reward_node_after_the_burst(seen: dict[str, Any]) -> None:
    assert seen["pool_size_after_burst"] == 0
    assert seen["nodes_after_burst"] == 1
    assert seen["reward_units_after_burst"] == 0
    assert seen["metrics"]["reward/scale_downs"] >= 2  # once after start, once after the burst
