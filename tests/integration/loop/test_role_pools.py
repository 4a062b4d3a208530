"""A PPO job with a pool per role on a "cluster" (tests/integration/kuberay_standin.py plays KubeRay and the pods):
the critic, the reference model, the rollout engine and the reward function each get their own pods, as in
examples/ppo-critic.yaml and examples/separate-rollout-elastic-reward.yaml, and their workers run only there.

Tiny: the models are tiny://demo (built in a second on each pod), one one-CPU pod per pool, two steps; the
reward pool is not elastic (the stand-in has no autoscaler).
"""

import re
from pathlib import Path

import pytest

from tests.integration.envtest import wait_until
from tests.integration.loop.conftest import Loop, short

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = {"replicas": 1, "cpus": 1, "memory": "2Gi"}
#: The Ray actor classes of kuberl's workers, as their processes are titled (`ray::ModelWorker.update`).
WORKER_TITLE = re.compile(r"^ray::(ModelWorker|RolloutWorker|RewardWorker)\b")


def worker_classes(pids: set[int]) -> set[str]:
    """The kuberl worker classes among these processes (Ray titles each actor's process with its class)."""
    found = set()
    for pid in pids:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        match = WORKER_TITLE.match(title)
        if match:
            found.add(match.group(1))
    return found


def test_a_ppo_job_with_a_pool_per_role_runs_each_role_on_its_own_pods(loop: Loop):
    manifest = short(
        "tiny-grpo-cluster.yaml",
        "tiny-ppo-pools",
        **{
            "spec.training.totalSteps": 2,
            "spec.algorithm": {"name": "ppo", "groupSize": 2, "kl": {"coef": 0.01}},
            "spec.models.actor.path": "tiny://demo",
            "spec.models.critic": {"path": "tiny://demo"},
            "spec.rollout.placement": "separate",
            "spec.resources": {pool: POOL for pool in ("actor", "critic", "reference", "rollout", "reward")},
        },
    )
    name = loop.create(manifest)
    wait_until(
        lambda: ((loop.rljob(name).get("status") or {}).get("progress") or {}).get("step"),
        timeout=400,
        what="the first step reported",
    )
    # the RayJob now running: on a loaded machine a node can miss its heartbeats and the job restart as -1
    current = f"{name}-{(loop.rljob(name).get('status') or {}).get('restarts', 0)}"
    on_pods = {pod.group: worker_classes(pod.processes()) for pod in loop.standin.pods(loop.namespace, current)}

    loop.wait_phase(name, "Succeeded", timeout=300)

    assert on_pods == {
        "head": set(),
        "actor": {"ModelWorker"},
        "critic": {"ModelWorker"},
        "reference": {"ModelWorker"},
        "rollout": {"RolloutWorker"},
        "reward": {"RewardWorker"},
    }, loop.diagnosis(name)
