"""Which spec changes a running job can take by restarting from its checkpoint, and which it cannot.

A checkpoint holds the actor's (and critic's) weights and optimizer state for one model and one
algorithm. Resuming it under a different actor model, a different algorithm or with a critic
added or removed would silently train something else, so those changes are refused. `runPolicy`
is the operator's own business (restarts, suspend, deadline, TTL): changing it never restarts
the RayJob. Specs are compared parsed (defaults filled in), so spelling out a default changes nothing.
"""

from typing import Any

from kuberl.api import RLJobSpec


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
    return problems
