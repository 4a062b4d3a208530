"""Which pods each role gets and which Ray actors live on them: decided once, here.

    topology = plan_topology(job.spec)
    topology.pools    # the kinds of pod: the Ray head, and one KubeRay worker group per spec.resources entry
    topology.groups   # the sets of Ray actors the runtime starts, each pinned to one pool

The operator renders the head and a worker group from each pool (operator/builders.py). The runtime
starts each group's actors asking for its pool's resource (runtime/pools/launch.py, group.py,
rewards/pool.py), and a local `kuberl run` starts a Ray that offers what every pool offers at its
largest, so an actor is placed by the same rule on one machine as on a cluster. A seam test builds
the RayJob of every example and checks, from that object alone, that every actor fits
(tests/unit/test_seam.py).

Pinning. Each pod of a pool offers `units` of a custom Ray resource no other pool offers
(`kuberl_<pool>`, api/contract.py): one unit per actor meant to live on that pod. Each actor asks for
one unit besides its CPUs and GPUs. So an actor lands only on its own pool's pods, a pod never takes
more actors than it was sized for, and an actor that no pod can take makes the KubeRay autoscaler add a
pod of exactly that pool.

Colocation (the hybrid engine; verl's ActorRolloutRefWorker): a role without a pool of its own runs
inside the actor's workers, one process per rank holding several models: the rollout engine when
rollout.placement is colocated, the reference model and the critic when spec.resources has no entry for
them. A reward without a pool runs one worker on the Ray head, beside the controller.

Environments (spec.environment). Their workers hold the episodes' environments and start the sandboxed
processes of their tools, so they live where the reward workers live: one per reward pod (the reward
pool's `replicas`; one on the head without a reward pool), beside that pod's reward worker. The pod's
CPUs are split between the two. Episodes are pinned to their environment worker, so the group does not
scale while the job runs. A worker runs one tool call per CPU it has at once (`tool_calls_at_once`), each
held to toolMemoryMib plus its scratch, so a pool that runs tools gets, unless its spec entry sets one, a
memory limit that holds them (`tool_pod_memory_mib`) and always an ephemeral-storage limit.

Elastic bounds. A pool's pods move between min_pods and max_pods (spec minReplicas/maxReplicas; the
API lets only the reward and a separate rollout pool differ). The reward group's actors move between
the same bounds (the runtime's reward pool asks for more when its queue waits and releases idle ones;
the autoscaler follows with pods). The rollout group keeps `replicas` engines.
"""

import math
from dataclasses import dataclass

from kuberl.api.contract import UNITS_PER_ACTOR, ray_resource
from kuberl.api.enums import Role, RolloutPlacement
from kuberl.api.environment import TOOL_SCRATCH_MIB, EnvironmentSpec
from kuberl.api.resources import RoleResources
from kuberl.api.spec import RLJobSpec

#: The pool of the Ray head pod (it runs the controller, the driver of the whole job).
HEAD_POOL = "head"
#: CPUs of the single reward worker beside the controller when spec.resources.reward is not set.
DEFAULT_REWARD_CPUS = 0.5
#: The group of the environment workers (spec.environment); they live on the reward pool's pods.
ENVIRONMENT_GROUP = "environment"
#: Memory a pod that runs tool calls keeps besides them: its Ray processes, its reward and environment workers.
TOOL_POD_BASE_MIB = 2048
#: Ephemeral storage of a pod that runs tool calls (Ray's logs, each call's captured output; a call's scratch
#: is memory): a bound, so that no call's output can fill the node's disk.
TOOL_POD_EPHEMERAL_STORAGE = "8Gi"


def tool_calls_at_once(cpus: float) -> int:
    """Tool calls an environment worker with `cpus` runs at once: one per whole CPU (a call may keep a core busy
    for all of its time limit), at least one."""
    return max(1, math.floor(cpus))


def tool_pod_memory_mib(environment: EnvironmentSpec, cpus: float) -> int:
    """Memory for a pod whose environment worker has `cpus`: its calls at once at their limits, and the base."""
    return TOOL_POD_BASE_MIB + tool_calls_at_once(cpus) * (environment.tool_memory_mib + TOOL_SCRATCH_MIB)


@dataclass(frozen=True)
class ActorGroup:
    """A set of identical Ray actors the runtime starts, all on one pool.

    The model groups (actor, critic, reference) are the ranks of one torch process group; the rollout
    group is one engine per pod; the reward group is the elastic pool of reward workers.
    """

    #: The group, named by its leading role: the actor group is `actor` even when it hosts the rollout too;
    #: the environment workers' group is `environment` (ENVIRONMENT_GROUP; it has no role of its own).
    name: Role | str
    #: What each actor hosts. The actor group: actor, plus rollout, reference and critic when they are
    #: colocated (no pool of their own); any other group: its own role only.
    roles: tuple[Role, ...]
    #: The pool (`head` or a role) whose pods the actors live on.
    pool: str
    #: Actors started at the beginning. A model group's world size: one rank per GPU (one per pod on CPU).
    actors: int
    #: The fewest and most actors alive at once; only the reward group and the separate rollout move between them.
    min_actors: int
    max_actors: int
    #: How many of them one pod of the pool holds (a trainer: one per GPU; an engine or a reward worker: one).
    actors_per_pod: int
    #: Ray CPUs each actor asks for: its share of the pod's CPUs.
    cpus: float
    #: Ray GPUs each actor asks for: 1 for a trainer rank, the pod's GPUs for an engine or reward replica.
    gpus: int
    #: The custom Ray resource of the pool, of which each actor asks `units`.
    resource: str
    units: int = UNITS_PER_ACTOR

    @property
    def ray_resources(self) -> dict[str, float]:
        """The custom resources each actor asks Ray for: its pool's, `units` of it."""
        return {self.resource: float(self.units)}


@dataclass(frozen=True)
class Pool:
    """One kind of pod: the Ray head, or one KubeRay worker group made from a spec.resources entry."""

    #: `head`, or the role whose spec.resources entry made it (the worker group's groupName).
    name: str
    #: Pods at start (spec.resources.<role>.replicas; the head is one pod).
    pods: int
    #: The fewest and most pods the autoscaler keeps; both equal `pods` unless the pool is elastic.
    min_pods: int
    max_pods: int
    #: CPU cores, GPUs and memory (a Kubernetes quantity, None: no limit) per pod. The head's size is the
    #: operator's setting (KUBERL_HEAD_CPU / KUBERL_HEAD_MEMORY); here it says what its actors need. A pool
    #: that runs tool calls gets memory enough for them when its spec entry sets none.
    cpus: float
    gpus: int
    memory: str | None
    #: The custom Ray resource only this pool's pods offer (`kuberl_<name>`).
    resource: str
    #: Units of `resource` each pod offers: one per actor of the pool's groups it holds (0: it holds none).
    units: int
    #: Roles whose actors live on these pods, colocated ones included.
    roles: tuple[Role, ...]
    #: Ephemeral storage per pod (a Kubernetes quantity): set for the pools that run tool calls, None elsewhere.
    ephemeral_storage: str | None = None

    @property
    def elastic(self) -> bool:
        return self.min_pods < self.max_pods

    @property
    def offered_resources(self) -> dict[str, float]:
        """The custom resources each pod offers Ray (none when it holds no actor)."""
        return {self.resource: float(self.units)} if self.units else {}


@dataclass(frozen=True)
class Topology:
    """The pools (head first, then the worker groups in role order, actor first) and the actor groups."""

    pools: tuple[Pool, ...]
    groups: tuple[ActorGroup, ...]

    @property
    def worker_pools(self) -> tuple[Pool, ...]:
        """The pools that become KubeRay worker groups: all but the head."""
        return tuple(pool for pool in self.pools if pool.name != HEAD_POOL)

    @property
    def head(self) -> Pool:
        return self.pool(HEAD_POOL)

    @property
    def actor(self) -> ActorGroup:
        """The actor group: every job has one."""
        return self._always(Role.ACTOR)

    @property
    def reward(self) -> ActorGroup:
        """The reward group: every job has one."""
        return self._always(Role.REWARD)

    def _always(self, name: Role) -> ActorGroup:
        group = self.group(name)
        assert group is not None, f"plan_topology always makes the {name} group"
        return group

    def pool(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool {name!r}; the pools are {', '.join(p.name for p in self.pools)}")

    @property
    def environment(self) -> ActorGroup | None:
        """The environment workers' group: only a job with spec.environment has one."""
        return self.group(ENVIRONMENT_GROUP)

    def group(self, name: Role | str) -> ActorGroup | None:
        """The actor group named `name`, or None when the job has none (no critic, no separate rollout ...)."""
        return next((group for group in self.groups if group.name == name), None)

    def local_resources(self) -> dict[str, float]:
        """What one machine must offer Ray to hold every pool at its largest: a local run's custom resources."""
        return {pool.resource: float(pool.max_pods * pool.units) for pool in self.pools if pool.units}

    def local_cpus(self) -> float:
        """The CPUs every actor asks for together, with the elastic groups at their largest."""
        return sum(group.max_actors * group.cpus for group in self.groups)


def reads_reference(spec: RLJobSpec) -> bool:
    """Whether anything reads the reference model's log-probs: a KL term (in the reward or in the loss)."""
    return (spec.algorithm.kl.coef or 0) > 0


def actor_worker_roles(spec: RLJobSpec) -> tuple[Role, ...]:
    """The roles in the actor's workers: the actor, and every role that needs a home and has no pool."""
    resources = spec.resources
    roles = [Role.ACTOR]
    if spec.rollout.placement == RolloutPlacement.COLOCATED:
        roles.append(Role.ROLLOUT)
    if reads_reference(spec) and resources.reference is None:
        roles.append(Role.REFERENCE)
    if spec.models.critic is not None and resources.critic is None:
        roles.append(Role.CRITIC)
    return tuple(roles)


def model_group(name: Role, roles: tuple[Role, ...], pool: RoleResources) -> ActorGroup:
    """Trainer ranks (FSDP): one per GPU, one per pod on CPU; the pod's CPUs split between its ranks."""
    per_pod = max(1, pool.gpus)
    return ActorGroup(
        name=name,
        roles=roles,
        pool=name.value,
        actors=pool.world_size,
        min_actors=pool.world_size,
        max_actors=pool.world_size,
        actors_per_pod=per_pod,
        cpus=pool.cpus / per_pod,
        gpus=1 if pool.gpus else 0,
        resource=ray_resource(name.value),
    )


def rollout_group(pool: RoleResources) -> ActorGroup:
    """rollout.placement separate: one engine per pod, spanning the pod's GPUs, one per tensor-parallel shard
    (api/rules.py holds gpus to rollout.tensorParallelSize; on CPU the pod's cores are split between the shards'
    processes, which vLLM starts inside the actor: Ray sees the one actor)."""
    return ActorGroup(
        name=Role.ROLLOUT,
        roles=(Role.ROLLOUT,),
        pool=Role.ROLLOUT.value,
        actors=pool.replicas,
        min_actors=pool.effective_min,
        max_actors=pool.effective_max,
        actors_per_pod=1,
        cpus=pool.cpus,
        gpus=pool.gpus,
        resource=ray_resource(Role.ROLLOUT.value),
    )


def reward_pod_share(pool: RoleResources | None, environment: bool) -> float:
    """CPUs of each actor on a reward pod: the pod's, halved when an environment worker shares the pod."""
    cpus = DEFAULT_REWARD_CPUS if pool is None else pool.cpus
    return cpus / 2 if environment and pool is not None else cpus


def reward_group(pool: RoleResources | None, environment: bool = False) -> ActorGroup:
    """The reward workers: one per pod of the reward pool, between its bounds; without a pool, one on the head."""
    cpus = reward_pod_share(pool, environment)
    if pool is None:
        home, low, high, gpus = HEAD_POOL, 1, 1, 0
    else:
        home, low, high, gpus = Role.REWARD.value, pool.effective_min, pool.effective_max, pool.gpus
    return ActorGroup(
        name=Role.REWARD,
        roles=(Role.REWARD,),
        pool=home,
        actors=max(1, low),  # the first score call needs a worker even when the pool may idle at 0
        min_actors=low,
        max_actors=high,
        actors_per_pod=1,
        cpus=cpus,
        gpus=gpus,
        resource=ray_resource(home),
    )


def environment_group(pool: RoleResources | None) -> ActorGroup:
    """spec.environment's workers: one per reward pod at start (`replicas`), fixed; without a pool, one on the head."""
    home = HEAD_POOL if pool is None else Role.REWARD.value
    count = 1 if pool is None else pool.replicas
    return ActorGroup(
        name=ENVIRONMENT_GROUP,
        roles=(),
        pool=home,
        actors=count,
        min_actors=count,
        max_actors=count,
        actors_per_pod=1,
        cpus=reward_pod_share(pool, environment=True),
        gpus=0,
        resource=ray_resource(home),
    )


def actor_groups(spec: RLJobSpec) -> tuple[ActorGroup, ...]:
    """Every group the runtime starts: actor first, then critic and reference when they have pools, rollout
    when separate, reward, and the environment workers last."""
    resources = spec.resources
    groups = [model_group(Role.ACTOR, actor_worker_roles(spec), resources.actor)]
    if spec.models.critic is not None and resources.critic is not None:
        groups.append(model_group(Role.CRITIC, (Role.CRITIC,), resources.critic))
    if reads_reference(spec) and resources.reference is not None:
        groups.append(model_group(Role.REFERENCE, (Role.REFERENCE,), resources.reference))
    if spec.rollout.placement == RolloutPlacement.SEPARATE and resources.rollout is not None:
        groups.append(rollout_group(resources.rollout))
    groups.append(reward_group(resources.reward, environment=spec.environment is not None))
    if spec.environment is not None:
        groups.append(environment_group(resources.reward))
    return tuple(groups)


def _pool(
    name: str, size: RoleResources | None, groups: tuple[ActorGroup, ...], environment: EnvironmentSpec | None
) -> Pool:
    """The pool `name`, sized by its spec entry (None: the head), offering a unit per actor of its groups; a pool
    that runs tool calls is bounded in memory (unless its entry says) and ephemeral storage."""
    hosted = [group for group in groups if group.pool == name]
    tools = next((group for group in hosted if group.name == ENVIRONMENT_GROUP), None)
    if size is None:  # the head: one pod; its size is the operator's setting, here what its actors need
        pods = low = high = 1
        cpus, gpus, memory = sum((group.max_actors * group.cpus for group in hosted), 0.0), 0, None
    else:
        pods, low, high = size.replicas, size.effective_min, size.effective_max
        cpus, gpus, memory = size.cpus, size.gpus, size.memory
        if memory is None and tools is not None and environment is not None:
            memory = f"{tool_pod_memory_mib(environment, tools.cpus)}Mi"
    return Pool(
        name=name,
        pods=pods,
        min_pods=low,
        max_pods=high,
        cpus=cpus,
        gpus=gpus,
        memory=memory,
        resource=ray_resource(name),
        units=sum(group.actors_per_pod * group.units for group in hosted),
        roles=tuple(role for group in hosted for role in group.roles),
        ephemeral_storage=TOOL_POD_EPHEMERAL_STORAGE if tools is not None else None,
    )


def plan_topology(spec: RLJobSpec) -> Topology:
    """The pools and actor groups of a job: a pure function of its spec."""
    groups = actor_groups(spec)
    pools = [_pool(HEAD_POOL, None, groups, spec.environment)]
    for role in Role:
        size = getattr(spec.resources, role.value)
        if size is not None:
            pools.append(_pool(role.value, size, groups, spec.environment))
    return Topology(pools=tuple(pools), groups=groups)
