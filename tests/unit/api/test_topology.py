"""plan_topology: which pods each role gets, which roles share them, and what each actor asks for."""

import copy
from typing import Any

import pytest

from kuberl.api import Role, parse_rljob
from kuberl.api.topology import Topology, plan_topology, tool_calls_at_once

ACTOR, CRITIC, REFERENCE, REWARD, ROLLOUT = Role


def topology(minimal_manifest: dict, **spec: Any) -> Topology:
    minimal_manifest["spec"].update(spec)
    return plan_topology(parse_rljob(minimal_manifest).spec)


def test_a_job_without_pools_runs_every_model_role_in_the_actors_workers_and_the_reward_on_the_head(
    minimal_manifest: dict,
):
    plan = topology(minimal_manifest)  # grpo: a KL term, so a reference model; colocated rollout
    assert [pool.name for pool in plan.pools] == ["head", "actor"]
    assert [group.name for group in plan.groups] == [ACTOR, REWARD]
    assert plan.actor.roles == (ACTOR, ROLLOUT, REFERENCE)
    assert (plan.reward.pool, plan.reward.cpus, plan.reward.resource) == ("head", 0.5, "kuberl_head")
    assert plan.head.offered_resources == {"kuberl_head": 1.0}


def test_no_kl_term_means_no_reference_model(minimal_manifest: dict):
    plan = topology(minimal_manifest, algorithm={"name": "dapo"})  # dapo's preset has no KL
    assert plan.actor.roles == (ACTOR, ROLLOUT)
    assert all(REFERENCE not in group.roles for group in plan.groups)


def test_critic_and_reference_pools_get_groups_of_their_own(minimal_manifest: dict):
    plan = topology(
        minimal_manifest,
        algorithm={"name": "ppo"},
        models={"actor": {"path": "/models/a"}, "critic": {}},
        resources={"critic": {"replicas": 2, "gpus": 4}, "reference": {"gpus": 1}},
    )
    assert plan.actor.roles == (ACTOR, ROLLOUT)
    critic, reference = plan.group(CRITIC), plan.group(REFERENCE)
    assert critic is not None and reference is not None
    assert (critic.roles, critic.pool, critic.actors, critic.resource) == ((CRITIC,), "critic", 8, "kuberl_critic")
    assert (reference.roles, reference.actors, reference.resource) == ((REFERENCE,), 1, "kuberl_reference")


def test_a_critic_without_a_pool_is_colocated_with_the_actor(minimal_manifest: dict):
    plan = topology(minimal_manifest, algorithm={"name": "ppo"}, models={"actor": {"path": "/a"}, "critic": {}})
    assert plan.actor.roles == (ACTOR, ROLLOUT, REFERENCE, CRITIC)
    assert plan.group(CRITIC) is None and [group.name for group in plan.groups] == [ACTOR, REWARD]


def test_trainer_ranks_are_one_per_gpu_sharing_the_pods_cpus_and_each_pod_offers_a_unit_per_rank(
    minimal_manifest: dict,
):
    plan = topology(minimal_manifest, resources={"actor": {"replicas": 2, "gpus": 8, "cpus": 64, "memory": "900Gi"}})
    actor = plan.actor
    assert (actor.actors, actor.actors_per_pod, actor.cpus, actor.gpus) == (16, 8, 8.0, 1)
    pool = plan.pool("actor")
    assert (pool.pods, pool.cpus, pool.gpus, pool.memory, pool.units) == (2, 64.0, 8, "900Gi", 8)
    assert actor.ray_resources == {"kuberl_actor": 1.0}


def test_a_cpu_pool_has_one_rank_per_pod(minimal_manifest: dict):
    actor = topology(minimal_manifest, resources={"actor": {"replicas": 3, "cpus": 0.5}}).actor
    assert (actor.actors, actor.actors_per_pod, actor.cpus, actor.gpus) == (3, 1, 0.5, 0)


def test_a_separate_rollout_is_one_engine_per_pod_spanning_its_gpus(minimal_manifest: dict):
    plan = topology(
        minimal_manifest,
        rollout={"placement": "separate", "tensorParallelSize": 4},
        resources={"actor": {"gpus": 8}, "rollout": {"replicas": 2, "minReplicas": 2, "maxReplicas": 4, "gpus": 4}},
    )
    rollout = plan.group(ROLLOUT)
    assert rollout is not None and ROLLOUT not in plan.actor.roles
    # the runtime's replicas move between the pool's bounds, as its pods do
    assert (rollout.actors, rollout.min_actors, rollout.max_actors, rollout.gpus, rollout.actors_per_pod) == (
        2,
        2,
        4,
        4,
        1,
    )
    pool = plan.pool("rollout")
    assert (pool.pods, pool.min_pods, pool.max_pods, pool.elastic, pool.units) == (2, 2, 4, True, 1)


def test_a_split_engine_on_cpu_is_one_actor_per_pod_with_the_pods_cores_for_its_shards(minimal_manifest: dict):
    plan = topology(
        minimal_manifest,
        rollout={"placement": "separate", "tensorParallelSize": 2},
        resources={"rollout": {"replicas": 1, "cpus": 2}},
    )
    rollout = plan.group(ROLLOUT)
    assert rollout is not None
    assert (rollout.actors, rollout.actors_per_pod, rollout.cpus, rollout.gpus) == (1, 1, 2.0, 0)


def test_the_reward_pool_moves_between_its_bounds(minimal_manifest: dict):
    plan = topology(minimal_manifest, resources={"reward": {"replicas": 2, "minReplicas": 0, "maxReplicas": 16}})
    reward = plan.reward
    assert (reward.pool, reward.actors, reward.min_actors, reward.max_actors) == ("reward", 1, 0, 16)
    assert plan.head.offered_resources == {}  # nothing lives beside the controller
    assert plan.pool("reward").elastic


def test_a_reference_pool_that_nothing_reads_holds_no_actor(minimal_manifest: dict):
    plan = topology(minimal_manifest, algorithm={"name": "dapo"}, resources={"reference": {"gpus": 1}})
    assert plan.group(REFERENCE) is None
    assert (plan.pool("reference").units, plan.pool("reference").offered_resources) == (0, {})


def test_a_local_run_offers_every_pool_at_its_largest(minimal_manifest: dict):
    plan = topology(
        minimal_manifest,
        resources={"actor": {"replicas": 2, "cpus": 0.5}, "reward": {"minReplicas": 1, "maxReplicas": 4, "cpus": 2}},
    )
    assert plan.local_resources() == {"kuberl_actor": 2.0, "kuberl_reward": 4.0}
    assert plan.local_cpus() == 2 * 0.5 + 4 * 2


@pytest.mark.parametrize("role", [ACTOR, REWARD])
def test_every_job_has_an_actor_and_a_reward_group(minimal_manifest: dict, role: Role):
    assert topology(minimal_manifest).group(role) is not None


def test_environment_workers_share_the_reward_pods_one_each_and_split_their_cpus(minimal_manifest: dict):
    environment = {"name": "python", "maxEpisodeTokens": 256}
    reward_pool = {"replicas": 2, "minReplicas": 1, "maxReplicas": 4, "cpus": 8}
    plan = topology(minimal_manifest, environment=environment, resources={"reward": reward_pool})
    group = plan.environment
    assert group is not None and [g.name for g in plan.groups] == [ACTOR, REWARD, "environment"]
    assert (group.pool, group.actors, group.max_actors, group.cpus, group.gpus) == ("reward", 2, 2, 4.0, 0)
    assert plan.reward.cpus == 4.0  # the pod's 8 CPUs: half to its reward worker, half to its environment worker
    assert plan.pool("reward").offered_resources == {"kuberl_reward": 2.0}  # a unit for each


def test_without_a_reward_pool_the_environment_worker_runs_on_the_head(minimal_manifest: dict):
    plan = topology(minimal_manifest, environment={"name": "python", "maxEpisodeTokens": 256})
    group = plan.environment
    assert group is not None and (group.pool, group.actors, group.cpus) == ("head", 1, 0.5)
    assert plan.head.offered_resources == {"kuberl_head": 2.0}


def test_a_reward_pool_that_runs_tools_is_bounded_for_its_calls_at_once_unless_it_says_its_memory(
    minimal_manifest: dict,
):
    environment = {"name": "python", "maxEpisodeTokens": 256, "toolMemoryMib": 512}
    plan = topology(minimal_manifest, environment=environment, resources={"reward": {"replicas": 2, "cpus": 8}})
    # the environment worker has 4 of the pod's 8 CPUs: 4 calls at once of 512 + 64 MiB, and 2048 MiB for the rest
    assert tool_calls_at_once(plan.environment.cpus) == 4
    assert plan.pool("reward").memory == f"{2048 + 4 * (512 + 64)}Mi"
    assert plan.pool("reward").ephemeral_storage == "8Gi"
    said = topology(minimal_manifest, resources={"reward": {"replicas": 2, "cpus": 8, "memory": "64Gi"}})  # tools too
    assert said.pool("reward").memory == "64Gi"


def test_a_worker_runs_at_least_one_call_and_pools_without_tools_get_no_default_limits(minimal_manifest: dict):
    plain = topology(copy.deepcopy(minimal_manifest), resources={"reward": {"replicas": 2, "cpus": 8}})
    plan = topology(minimal_manifest, environment={"name": "python", "maxEpisodeTokens": 256})
    assert tool_calls_at_once(plan.environment.cpus) == 1  # half a CPU on the head
    assert plan.head.ephemeral_storage == "8Gi"  # the head's memory is the operator's setting
    assert (plain.pool("reward").memory, plain.pool("reward").ephemeral_storage) == (None, None)
