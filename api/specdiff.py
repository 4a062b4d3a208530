"""Which spec changes a job can take by resuming its checkpoint, and which it cannot.

A checkpoint holds the actor's (and critic's) weights and optimizer state for one model and one
algorithm. Resuming it under a different actor model, a different algorithm or with a critic
added or removed would silently train something else, so those changes are refused. So are the
changes the saved shards cannot be loaded under: another critic model, a parameter dtype or a LoRA
configuration they were not written in (the load would fail on every restart). Specs are compared
parsed (defaults filled in), so spelling out a default changes nothing.

Both sides apply these rules (the runtime may not import the operator, so they live here):
- the operator, to a running job's spec change (`unsafe_changes`, operator/decide.py): a refused change
  keeps the job running the old spec. It also refuses a new checkpoint location: the restart would not
  find the job's checkpoints there and would start over from step 0. `runPolicy` is the operator's own
  business (restarts, suspend, deadline, TTL): changing it never restarts the RayJob.
- the runtime, between the spec a checkpoint was written under (its job.yaml) and the spec about to resume
  it (`resume_problems`, runtime/checkpoint/checkpointing.py): a job created again under the same name, or
  a `kuberl run` of an edited manifest, never resumes a checkpoint its spec cannot follow. Where the
  checkpoints are is no question there: it found them.
"""

from collections.abc import Callable
from typing import Any

from kuberl.api.spec import RLJobSpec

#: Fields a checkpoint is found by: (path in the spec, its value in a parsed spec, why a change is refused).
LOCATION_BOUND: tuple[tuple[str, Callable[[RLJobSpec], Any], str], ...] = (
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
)
#: Fields whose saved state a checkpoint holds, and cannot be loaded under another value of.
STATE_BOUND: tuple[tuple[str, Callable[[RLJobSpec], Any], str], ...] = (
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
#: Every field whose change a running job's checkpoint cannot follow.
CHECKPOINT_BOUND = LOCATION_BOUND + STATE_BOUND


def runtime_part(spec: RLJobSpec) -> dict[str, Any]:
    """What the runtime depends on: the spec with its defaults filled in, without runPolicy."""
    return spec.model_dump(mode="json", exclude={"run_policy"})


def runtime_spec_changed(running: RLJobSpec, desired: RLJobSpec) -> bool:
    """True when the runtime would do something different; writing out a default is no change."""
    return runtime_part(running) != runtime_part(desired)


def unsafe_changes(running: RLJobSpec, desired: RLJobSpec) -> list[str]:
    """Why restarting a running job from its checkpoint under `desired` would be wrong; empty when it is safe."""
    return _problems(running, desired, CHECKPOINT_BOUND)


def resume_problems(saved: RLJobSpec, current: RLJobSpec) -> list[str]:
    """Why `current` cannot resume a checkpoint written under `saved`, wherever it was found; empty when it can."""
    return _problems(saved, current, STATE_BOUND)


def _problems(
    before: RLJobSpec, after: RLJobSpec, bound: tuple[tuple[str, Callable[[RLJobSpec], Any], str], ...]
) -> list[str]:
    problems = []
    if before.models.actor.path != after.models.actor.path:
        problems.append(
            f"spec.models.actor.path changed from {before.models.actor.path!r} to {after.models.actor.path!r}; "
            "a checkpoint of one model cannot continue another (create a new RLJob instead)"
        )
    if before.algorithm.name != after.algorithm.name:
        problems.append(
            f"spec.algorithm.name changed from {before.algorithm.name.value} to {after.algorithm.name.value}; "
            "create a new RLJob for a different algorithm"
        )
    if (before.models.critic is None) != (after.models.critic is None):
        change = "added" if after.models.critic is not None else "removed"
        problems.append(f"spec.models.critic was {change}; the checkpoint's training state does not match")
        return problems  # the critic's own fields follow from that
    for path, value_of, why in bound:
        old, new = value_of(before), value_of(after)
        if old != new:
            problems.append(f"{path} changed from {old!r} to {new!r}; {why} (create a new RLJob instead)")
    return problems
