"""Starting the job's Ray and its worker groups where the topology places them (api/topology.py).

    started = start_ray(address, plan.topology)  # join a cluster, or start a Ray offering every pool's resource
    groups = start_groups(plan)                  # the model groups set up; the rollout pool (separate), the reward
                                                 # pool, and the environment workers when the job has spec.environment
    ...
    groups.shutdown()

A local run starts Ray with the custom resources the pools would offer on Kubernetes at their
largest (`Topology.local_resources`), so every actor asks for the same thing on one machine as on a
cluster, and an actor the topology did not plan for waits instead of squeezing in; and with Ray's token
authentication on, with a token of its own (`use_a_token_of_its_own`): its ports are open on every interface.
"""

import logging
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import ray

from kuberl.api import RLJob, Role
from kuberl.api.contract import ray_resource
from kuberl.api.topology import HEAD_POOL, Topology
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.pools.environment import EnvironmentPool
from kuberl.runtime.pools.reward import RewardPool
from kuberl.runtime.pools.rollout import RolloutPool
from kuberl.runtime.workers.group import WorkerGroup, warm_workers
from kuberl.runtime.workers.model_worker import ModelWorker, WorkerSetup

log = logging.getLogger(__name__)

#: The model groups: the ranks of one torch process group each, hosting trainers (and a colocated engine).
MODEL_GROUPS = (Role.ACTOR, Role.CRITIC, Role.REFERENCE)


class Launch(Protocol):
    """What starting a run's groups reads of its plan (loop/plan.py RunPlan has it all)."""

    job: RLJob
    topology: Topology
    models: dict[str, ModelLocation]  # role -> where its model is; each worker resolves it on its own node
    tokenizer_location: ModelLocation

    @property
    def total_steps(self) -> int: ...


@dataclass
class Groups:
    """The started groups of one run, by role."""

    actor: WorkerGroup  # the actor's ranks with the roles colocated in them (rollout, reference, critic)
    reward: RewardPool  # the elastic reward workers
    critic: WorkerGroup | None = None  # the critic with a pool of its own
    reference: WorkerGroup | None = None  # the reference with a pool of its own
    rollout: RolloutPool | None = None  # rollout.placement separate: engine replicas fed by weight broadcast
    environment: EnvironmentPool | None = None  # spec.environment: the workers the episodes' environments live in

    def host(self, role: str) -> WorkerGroup:
        """The group whose ranks hold `role`'s model: its own, or the actor's it is colocated in."""
        own = {"critic": self.critic, "reference": self.reference}.get(role)
        return own or self.actor

    def model_nodes(self) -> dict[str, list[str]]:
        """The nodes of the model groups' ranks (a run loses a step with any of them), each with who runs there."""
        nodes: dict[str, list[str]] = {}
        for group in (self.actor, self.critic, self.reference):
            if group is not None:
                for rank, node in enumerate(group.call("node_id")):
                    nodes.setdefault(node, []).append(f"{group.group.name} worker {rank}")
        return nodes

    @property
    def trainers(self) -> list[WorkerGroup]:
        """The groups holding trained models (what a checkpoint saves): the actor's, and the critic's own."""
        return [self.actor] + ([self.critic] if self.critic is not None else [])

    def shutdown(self) -> None:
        self.reward.shutdown()
        for pool in (self.environment, self.rollout):
            if pool is not None:
                pool.shutdown()
        for group in (self.actor, self.critic, self.reference):
            if group is not None:
                group.stop()  # a colocated engine split over ranks removes its shared memory on the way


def start_shared_ray(num_cpus: int = 4, **options: Any) -> None:
    """A local Ray of this process's own that tests and benchmarks share: 64 units of every pool's resource, room
    for any job they run, and quiet (no dashboard, the workers' output not copied here). `options` go to `ray.init`
    as well. Local by name, as in `start_ray`: a `ray start` on this machine may have recorded a cluster that a
    plain `ray.init()` would join."""
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources={ray_resource(pool): 64.0 for pool in (HEAD_POOL, *Role)},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        **options,
    )


def start_ray(address: str | None, topology: Topology) -> bool:
    """Join a cluster (`address`, or RAY_ADDRESS), or start a local Ray offering what the topology's pools offer;
    True when this call started it (and must stop it).

    Without an address, Ray's own `ray.init()` would join the cluster a `ray start` on this machine last recorded
    (`ray_current_cluster` in Ray's temp folder, python/ray/_private/services.py
    `get_ray_address_from_environment`), and fail there, as a job that names CPUs and resources may not join: so
    the local Ray is asked for by name."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        warn_of_missing_resources(topology)
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or "auto", log_to_driver=True)
        warn_of_missing_resources(topology)
        return False
    use_a_token_of_its_own()
    ray.init(
        address="local",  # its own, even where a `ray start` on this machine left its address in Ray's temp folder
        num_cpus=max(os.cpu_count() or 1, math.ceil(topology.local_cpus())),
        resources=topology.local_resources(),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return True


def use_a_token_of_its_own() -> None:
    """Ray's token authentication on, with a fresh token, for the local Ray this process is about to start.

    A local Ray listens on every interface, and cannot be told not to: Ray 2.60's gRPC servers (GCS, raylet,
    workers) bind the wildcard address (src/ray/rpc/grpc_server.cc, GrpcServer::Run; listen_to_localhost_only
    is for Ray's internal servers), and ray.init turns a node address of 127.0.0.1 into a reachable one
    (python/ray/_private/services.py resolve_ip_for_localhost). Without authentication anyone who can reach
    this machine could join it as a driver and run code. So the run's Ray keeps token authentication on (Ray
    2.52+), with 32 random bytes made for this run, in RAY_AUTH_TOKEN, which the GCS, the raylet and the
    workers inherit; an explicit RAY_AUTH_MODE=disabled does not turn it off. Ray read its configuration when
    it was imported: it is read again, as Ray's own authentication_test_utils.reset_auth_token_state does.
    """
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # not in its .pyi

    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)  # the token above, not a file's
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def warn_of_missing_resources(topology: Topology) -> None:
    """A joined cluster without a pool's resource leaves that pool's actors waiting: say so up front."""
    offered = ray.cluster_resources()
    for pool in topology.pools:
        needed = pool.min_pods * pool.units
        if needed and offered.get(pool.resource, 0) < needed:
            log.warning(
                "the Ray cluster offers %g of %s, the %s pool's actors need %d: they wait for nodes that offer it "
                "(on Kubernetes the operator's worker group; by hand: ray start --resources)",
                offered.get(pool.resource, 0),
                pool.resource,
                pool.name,
                needed,
            )


def start_groups(plan: Launch) -> Groups:
    """Every group of the topology, set up: the model groups load their models while the rollout replicas,
    the reward pool and the environment workers start. Whatever was started is stopped again if any part fails."""
    started: dict[Role | str, WorkerGroup] = {}
    pools: list[Any] = []  # the rollout, reward and environment pools started so far
    warm = warm_workers()
    if warm is not None:  # idle workers of earlier runs that this one cannot use give their resources back first
        warm.retain(
            {warm.shape(ModelWorker, group, None) for group in plan.topology.groups if group.name in MODEL_GROUPS}
        )
    try:
        for group in plan.topology.groups:
            if group.name in MODEL_GROUPS:
                started[group.name] = WorkerGroup(ModelWorker, group)
        pending = [call for workers in started.values() for call in setup_calls(plan, workers)]
        rollout = start_rollout(plan)
        pools.append(rollout)
        reward = RewardPool(plan.job.spec.reward.to_manifest(), plan.models.get("reward"), plan.topology.reward)
        pools.append(reward)
        environment = start_environment(plan)
        pools.append(environment)
        ray.get(pending)
    except BaseException:
        for pool in pools:
            if pool is not None:
                pool.shutdown()
        for workers in started.values():
            workers.kill()
        raise
    return Groups(
        actor=started[Role.ACTOR],
        reward=reward,
        critic=started.get(Role.CRITIC),
        reference=started.get(Role.REFERENCE),
        rollout=rollout,
        environment=environment,
    )


def start_rollout(plan: Launch) -> RolloutPool | None:
    """rollout.placement separate: its replicas, set up with the actor's initial model (None when colocated)."""
    group = plan.topology.group(Role.ROLLOUT)
    if group is None:
        return None
    return RolloutPool(plan.job.to_manifest(), plan.models["actor"], plan.tokenizer_location, group)


def start_environment(plan: Launch) -> EnvironmentPool | None:
    """spec.environment: its workers, on the topology's environment group (None without one)."""
    environment, group = plan.job.spec.environment, plan.topology.environment
    if environment is None or group is None:
        return None
    return EnvironmentPool(environment, group)


def setup_calls(plan: Launch, workers: WorkerGroup) -> list[Any]:
    """The setup of every worker of a group, under way: each model group is a process group of its own.

    The workers are given the models' locations and resolve them on their own nodes."""
    group = workers.group
    job = plan.job.to_manifest()
    threads = max(1, int(group.cpus))
    master_addr, master_port = ray.get(workers.workers[0].address.remote())
    setup = WorkerSetup(
        job=job,
        roles=tuple(role.value for role in group.roles),
        models=plan.models,
        tokenizer=plan.tokenizer_location,
        master_addr=master_addr,
        master_port=master_port,
        total_steps=plan.total_steps,
        threads=threads,
    )
    return [worker.setup.remote(setup) for worker in workers.workers]
