"""`kuberl convert verl run.sh`: a verl launch as an RLJob manifest, and every knob that did not make it.

    conversion = convert(read_launch(script), name=None)
    conversion.manifest       # the RLJob, as a dict (YAML-ready), holding only what differs from kuberl's defaults
    conversion.lost           # LostKnob per verl knob kuberl cannot carry, each saying whether it changes training

The command line's overrides are laid over verl's defaults (knobs.VERL_DEFAULTS), so a knob the script
leaves at verl's default still reaches the job when kuberl's default differs; the manifest is then pruned
of every field that kuberl would fill with the same value anyway, so what is left reads as what this job
does differently. The manifest is validated: a value kuberl refuses is reported with its field path.
"""

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kuberl.api import parse_rljob
from kuberl.api.manifest import suggested_name
from kuberl.verl.command import LaunchError
from kuberl.verl.knobs import NO_EFFECT, VERL_DEFAULTS, Carry, LostKnob, knob_for
from kuberl.verl.rules import JOINT_KEYS


@dataclass
class Conversion:
    manifest: dict[str, Any]
    lost: list[LostKnob] = field(default_factory=list)

    @property
    def changes_training(self) -> list[LostKnob]:
        """The lost knobs that change what is trained (the converted job would learn something else)."""
        return [knob for knob in self.lost if knob.changes_training]


#: Keys a command line must set: verl's defaults for them are placeholders.
REQUIRED = ("actor_rollout_ref.model.path", "data.train_files")

#: RLJob fields that only a critic reads.
CRITIC_ONLY = ("models.critic", "algorithm.valueClip", "algorithm.lam")


def job_name(experiment: Any) -> str:
    """verl's experiment name as an RLJob name: a DNS-1035 label of at most 40 characters.

    >>> job_name("qwen2_7b_function_rm"), job_name("GRPO-Qwen2.5-7B/run 1"), job_name("7b_grpo")
    ('qwen2-7b-function-rm', 'grpo-qwen2-5-7b-run-1', 'job-7b-grpo')
    """
    name = re.sub(r"[^a-z0-9-]+", "-", str(experiment).lower()).strip("-")
    return suggested_name(name) if name else "verl-job"  # KubeRay's rule: a letter first (job-7b-grpo)


_INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf's `${other.key}` values (a whole value naming another key) replaced by that key's value.

    >>> resolve_interpolations({"a.b": "/m", "c": "${a.b}", "d": "${c}"})
    {'a.b': '/m', 'c': '/m', 'd': '/m'}
    """
    resolved = dict(config)
    for _ in range(8):  # chains of interpolations, a few deep
        pending = False
        for key, value in resolved.items():
            match = _INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
            if match and match.group(1) in resolved and match.group(1) != key:
                resolved[key] = resolved[match.group(1)]
                pending = True
        if not pending:
            break
    left = [f"{key}={value}" for key, value in resolved.items() if isinstance(value, str) and "${" in value]
    if left:
        raise LaunchError(f"{', '.join(left)}: an interpolation the converter cannot resolve; write the value itself")
    return resolved


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    if isinstance(value, dict) and isinstance(tree.get(leaf), dict):
        tree[leaf].update(value)
    else:
        tree[leaf] = value


def convert(overrides: dict[str, Any], name: str | None = None) -> Conversion:
    """The RLJob for a verl command line's overrides (see the module docstring)."""
    unset = [key for key in REQUIRED if overrides.get(key) in (None, "", [])]
    if unset:  # verl's own defaults for these are placeholders (~/models/deepseek-llm-7b-chat, ...)
        raise LaunchError(f"the command line sets no {' and no '.join(unset)}; a verl job needs them too")
    config = resolve_interpolations({**VERL_DEFAULTS, **overrides})
    fields: dict[str, Any] = {}
    lost: list[LostKnob] = []
    consumed: set[str] = set()
    for rule, keys in JOINT_KEYS.items():
        try:
            derived = rule(config)
        except (TypeError, ValueError) as error:  # a number verl expects, given as something else
            named = [key for key, value in overrides.items() if value is not None and repr(value) in str(error)]
            named = named or [key for key in keys if key in overrides]
            given = ", ".join(f"{key}={overrides[key]!r}" for key in named)
            raise LaunchError(f"{given or rule.__name__}: not a value verl takes here ({error})") from None
        fields.update(derived.fields)
        lost.extend(derived.lost)
        consumed.update(keys, derived.consumed)
    for key, value in config.items():
        if key in consumed or NO_EFFECT.match(key):
            continue
        knob = knob_for(key)
        if isinstance(knob, Carry):
            try:
                fields[knob.field] = knob.convert(value)
            except (TypeError, ValueError) as error:
                raise LaunchError(f"{key}={value!r}: not a value verl takes here ({error})") from None
        elif knob is not None:
            if not knob.harmless(value):
                lost.append(LostKnob(key, value, knob.why, knob.changes_training))
        elif key not in VERL_DEFAULTS:
            lost.append(LostKnob(key, value, "not in kuberl's table of verl knobs", True))
    if "data.val_files" not in config:  # nothing to validate: verl's validation knobs lose nothing
        lost = [knob for knob in lost if not knob.key.startswith(("trainer.val_", "actor_rollout_ref.rollout.val"))]
        fields.pop("training.validationEverySteps", None)
        fields.pop("training.validateBeforeTraining", None)
    if "models.critic" not in fields:  # no critic (no gae): its knobs have nothing to act on
        fields = {path: value for path, value in fields.items() if not path.startswith(CRITIC_ONLY)}
        lost = [knob for knob in lost if not knob.key.startswith("critic.")]
    spec: dict[str, Any] = {}
    for dotted in sorted(fields, key=lambda path: path.count(".")):  # parents before their children
        _set(spec, dotted, copy.deepcopy(fields[dotted]))
    manifest: dict[str, Any] = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name or job_name(config["trainer.experiment_name"])},
        "spec": spec,
    }
    manifest = prune(manifest)
    manifest["spec"] = in_order(manifest["spec"], parse_rljob(manifest).spec.model_dump(by_alias=True))
    return Conversion(manifest, sorted(lost, key=lambda knob: not knob.changes_training))


def in_order(tree: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """`tree`'s keys in the order `reference` (the schema's dump) has them, at every level.

    >>> in_order({"b": {"y": 1, "x": 2}, "a": 3}, {"a": 0, "b": {"x": 0, "y": 0}})
    {'a': 3, 'b': {'x': 2, 'y': 1}}
    """
    order = {key: position for position, key in enumerate(reference)}
    ordered = sorted(tree.items(), key=lambda item: order.get(item[0], len(order)))
    return {
        key: in_order(value, reference[key])
        if isinstance(value, dict) and isinstance(reference.get(key), dict)
        else value
        for key, value in ordered
    }


def _paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of a nested dict, children before their parent."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))
        yield (*prefix, key)


def _resolved(manifest: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return parse_rljob(manifest).spec.model_dump()
    except ValueError:
        return None


def prune(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest without the fields kuberl would fill with the same values; validated (raises ManifestError)."""
    parse_rljob(manifest)  # a value kuberl refuses is reported here, with its field path
    target = _resolved(manifest)
    for path in list(_paths(manifest["spec"])):
        trial = copy.deepcopy(manifest)
        node = trial["spec"]
        for part in path[:-1]:
            node = node.get(part, {})
        if path[-1] not in node:
            continue
        del node[path[-1]]
        if _resolved(trial) == target:
            manifest = trial
    return manifest
