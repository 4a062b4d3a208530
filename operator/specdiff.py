"""Which spec changes a running job can take by restarting from its checkpoint, and which it cannot.

A checkpoint holds the actor's (and critic's) weights and optimizer state for one model and one
algorithm. Resuming it under a different actor model, a different algorithm or with a critic
added or removed would silently train something else, so those changes are refused. So are the
changes a restart cannot survive: a new checkpoint location (the restart would find nothing there
and silently start over from step 0), another critic model, a parameter dtype or a LoRA
configuration the saved shards were not written in (the load would fail on every restart). `runPolicy`
is the operator's own business (restarts, suspend, deadline, TTL): changing it never restarts
the RayJob. Specs are compared parsed (defaults filled in), so spelling out a default changes nothing.
"""

from collections.abc import Callable
from typing import Any

from kuberl.api import RLJobSpec

#: Fields whose change a checkpoint cannot follow: (path in the spec, its value in a parsed spec, why).
CHECKPOINT_BOUND: tuple[tuple[str, Callable[[RLJobSpec], Any], str], ...] = (
    (
        "spec.checkpoint.uri",
        lambda spec: spec.checkpoint.uri,
        "the restart would not find the job's checkpoints there and would start over from step 0",
    ),
    (
        "spec.checkpoint.pvcClaimName",
        lambda spec: spec.checkpoint.pvc_claim_name,
        "the restart would not find the job's checkpoints there and would start over from step 0",
    ),
    (
        "spec.models.critic.path",
        lambda spec: spec.models.critic.path if spec.models.critic else None,
        "the checkpoint holds the other critic's weights",
    ),
    (
        "spec.models.actor.dtype",
        lambda spec: spec.models.actor.dtype.value,
        "the checkpoint's shards hold the old dtype",
    ),
    (
        "spec.models.critic.dtype",
        lambda spec: spec.models.critic.dtype.value if spec.models.critic else None,
        "the checkpoint's shards hold the old dtype",
    ),
    (
        "spec.models.actor.lora",
        lambda spec: spec.models.actor.lora.model_dump(mode="json") if spec.models.actor.lora else None,
        "the checkpoint holds adapters of another shape, or none",
    ),
)


def runtime_part(spec: RLJobSpec) -> dict[str, Any]:
    """What the runtime depends on: the spec with its defaults filled in, without runPolicy."""
    return spec.model_dump(mode="json", exclude={"run_policy"})


def runtime_spec_changed(running: RLJobSpec, desired: RLJobSpec) -> bool:
    """True when the runtime would do something different; writing out a default is no change."""
    return runtime_part(running) != runtime_part(desired)


def unsafe_changes(running: RLJobSpec, desired: RLJobSpec) -> list[str]:
    """Why resuming `running`'s checkpoint under `desired` would be wrong; empty when it is safe."""
    problems = []
    if running.models.actor.path != desired.models.actor.path:
        problems.append(
            f"spec.models.actor.path changed from {running.models.actor.path!r} to {desired.models.actor.path!r}; "
            "a checkpoint of one model cannot continue another (create a new RLJob instead)"
        )
    if running.algorithm.name != desired.algorithm.name:
        problems.append(
            f"spec.algorithm.name changed from {running.algorithm.name.value} to {desired.algorithm.name.value}; "
            "create a new RLJob for a different algorithm"
        )
    if (running.models.critic is None) != (desired.models.critic is None):
        change = "added" if desired.models.critic is not None else "removed"
        problems.append(f"spec.models.critic was {change}; the checkpoint's training state does not match")
        return problems  # the critic's own fields follow from that
    for path, value_of, why in CHECKPOINT_BOUND:
        before, after = value_of(running), value_of(desired)
        if before != after:
            problems.append(f"{path} changed from {before!r} to {after!r}; {why} (create a new RLJob instead)")
    return problems
