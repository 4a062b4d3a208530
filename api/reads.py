"""Which pods read each local path a job names: what the runtime reads where, stated once for the checks.

On a cluster every pool is a pod of its own (api/topology.py), and a path names a file only on the pods
that mount the volume holding it. `local_reads(spec)` lists every local path the spec names (a model folder,
a tokenizer, a data file or directory, a reward file) with the pools whose pods open it, as the runtime does:

- the head runs the driver (runtime/loop/plan.py `make_plan`): it reads the actor's config and tokenizer, checks
  every other model location the spec names, loads the data, and checks the reward file;
- each model group (runtime/pools/launch.py, model_worker.py) loads the model of every role it hosts (the
  rollout engine starts from the actor's weights; the reference and the critic default to them) and the
  actor's tokenizer; a separate rollout pool does the same for the actor;
- the reward workers load the reward model or the reward file (on the head without a reward pool).

URIs (hf://, s3://, gs://, tiny://) are fetched or built by each pod itself and need no volume; they are
not listed. The operator's check (operator/cluster_checks.py) holds the list against the pod templates it
builds.
"""

from dataclasses import dataclass

from kuberl.api.enums import Role
from kuberl.api.spec import RLJobSpec
from kuberl.api.topology import HEAD_POOL, plan_topology

#: The scheme of a local path written as a URI: file:///models/x is the path /models/x.
FILE_SCHEME = "file://"


@dataclass(frozen=True)
class PathRead:
    """One local path the spec names, and the pools whose pods read it (head first, then in role order)."""

    field: str  # where the spec names it, e.g. spec.models.actor.path or spec.data.train[1]
    path: str  # as written, file:// removed: absolute, or relative to the manifest's folder
    pools: tuple[str, ...]


def local_path(location: str) -> str | None:
    """The path a location names on a pod's filesystem, or None for a URI each pod fetches itself.

    >>> local_path("/models/qwen"), local_path("file:///models/qwen"), local_path("hf://Qwen/Qwen2.5-7B")
    ('/models/qwen', '/models/qwen', None)
    """
    if location.startswith(FILE_SCHEME):
        return location.removeprefix(FILE_SCHEME)
    return None if "://" in location else location


def reward_file(function: str | None) -> str | None:
    """The Python file of a `path/to/reward.py[:function]` reward; None for a built-in or `module:function`.

    >>> reward_file("rewards/gsm8k.py"), reward_file("/r/my.py:score"), reward_file("pkg.mod:score")
    ('rewards/gsm8k.py', '/r/my.py', None)
    """
    if function is None:
        return None
    path = function if function.endswith(".py") else function.rpartition(":")[0]
    return path if path.endswith(".py") else None


def local_reads(spec: RLJobSpec) -> list[PathRead]:
    """Every local path `spec` names, with the pools whose pods read it."""
    models = spec.models
    actor = ("spec.models.actor.path", models.actor.path)
    tokenizer = ("spec.models.actor.tokenizer", models.actor.tokenizer) if models.actor.tokenizer else actor
    reference = actor
    if models.reference is not None and models.reference.path is not None:
        reference = ("spec.models.reference.path", models.reference.path)
    critic = actor
    if models.critic is not None and models.critic.path is not None:
        critic = ("spec.models.critic.path", models.critic.path)
    reward_model = ("spec.reward.model.path", spec.reward.model.path) if spec.reward.model is not None else None
    file = reward_file(spec.reward.function)
    reward_code = ("spec.reward.function", file) if file is not None else None

    readers: dict[tuple[str, str], list[str]] = {}

    def read(named: tuple[str, str] | None, pool: str) -> None:
        if named is not None and pool not in readers.setdefault(named, []):
            readers[named].append(pool)

    # the driver, on the head: it checks every model location the spec names before any worker starts
    for named in (actor, tokenizer, reference, critic, reward_model, reward_code):
        read(named, HEAD_POOL)
    for split in ("train", "validation"):
        locations = spec.data.locations(split)
        for index, location in enumerate(locations):
            field = (
                f"spec.data.{split}" if isinstance(getattr(spec.data, split), str) else f"spec.data.{split}[{index}]"
            )
            read((field, location), HEAD_POOL)
    for group in plan_topology(spec).groups:
        roles = set(group.roles)
        if roles & {Role.ACTOR, Role.ROLLOUT, Role.REFERENCE, Role.CRITIC}:
            read(tokenizer, group.pool)
        if roles & {Role.ACTOR, Role.ROLLOUT}:
            read(actor, group.pool)
        if Role.REFERENCE in roles:
            read(reference, group.pool)
        if Role.CRITIC in roles:
            read(critic, group.pool)
        if Role.REWARD in roles:
            read(reward_model, group.pool)
            read(reward_code, group.pool)
    reads = []
    for (field, location), pools in readers.items():
        path = local_path(location)
        if path is not None:
            reads.append(PathRead(field, path, tuple(pools)))
    return reads
