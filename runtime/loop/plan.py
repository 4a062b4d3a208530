"""Start-up: everything that can be checked before a Ray actor exists, checked.

`make_plan` checks that every model location can be resolved, loads and tokenizes the data, plans the
topology (which actors go on which pools, api/topology.py) and checks the batch arithmetic against the
trainers' sizes. Whatever is wrong surfaces here, naming the field or file, before any minute of
compute is spent. It also resolves what every step does (`StepSettings`, loop/settings.py), once.

The plan carries each model's *location* as the manifest names it (`ModelLocation`: tiny://, hf://,
s3://, or an absolute path), never a folder of the driver's: on a cluster each worker is a pod of its
own, so every worker resolves the models it loads on its own node (runtime/models/resolve.py). The
driver fetches only what it reads itself, the actor's tokenizer and config, not the weights.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from kuberl.api import RLJob, Role, RolloutEngine
from kuberl.api.topology import ActorGroup, Topology, plan_topology
from kuberl.runtime.data import PromptDataset, PromptLoader
from kuberl.runtime.loop.settings import StepSettings, step_settings
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.rewards.checks import check_reward_inputs, resolved_reward_file


class Tokenizer(Protocol):
    """What the controller asks of the actor's tokenizer (a transformers tokenizer has it)."""

    pad_token_id: int | None
    eos_token_id: int | None

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...


class RunConfigError(ValueError):
    """A job that cannot run as specified; the message names the field or file."""


@dataclass
class RunPlan:
    job: RLJob
    output_dir: Path
    base_dir: Path
    models: dict[str, ModelLocation]  # role -> where its model is; each worker resolves it on its own node
    tokenizer_location: ModelLocation  # the actor's tokenizer: spec.models.actor.tokenizer, else its model
    tokenizer: Tokenizer
    loader: PromptLoader
    topology: Topology
    mini_batches: int
    settings: StepSettings  # what every step does, resolved once (loop/settings.py)
    validation: PromptDataset | None = None  # data.validation, tokenized

    @property
    def total_steps(self) -> int:
        return self.loader.total_steps

    @property
    def actor_world_size(self) -> int:
        return self.topology.actor.actors


def model_locations(job: RLJob, base_dir: Path) -> dict[str, ModelLocation]:
    """Each role's model: the reference's and critic's default to the actor's, a reward model only when the
    reward is one."""
    models = job.spec.models
    actor = ModelLocation.of(models.actor.path, base_dir, "spec.models.actor.path")
    locations = {"actor": actor, "reference": actor}
    if models.reference is not None and models.reference.path is not None:
        locations["reference"] = ModelLocation.of(models.reference.path, base_dir, "spec.models.reference.path")
    if models.critic is not None:
        path = models.critic.path
        locations["critic"] = ModelLocation.of(path, base_dir, "spec.models.critic.path") if path else actor
    if job.spec.reward.model is not None:
        locations["reward"] = ModelLocation.of(job.spec.reward.model.path, base_dir, "spec.reward.model.path")
    return locations


def tokenizer_location(job: RLJob, base_dir: Path) -> ModelLocation:
    """The actor's tokenizer: spec.models.actor.tokenizer, else the actor's model's."""
    actor = job.spec.models.actor
    if actor.tokenizer:
        return ModelLocation.of(actor.tokenizer, base_dir, "spec.models.actor.tokenizer")
    return ModelLocation.of(actor.path, base_dir, "spec.models.actor.path")


def environment_tools(job: RLJob, model_path: str) -> list[dict[str, Any]]:
    """spec.environment's tools, for chat-template prompts; checks the class loads and episodes fit the model."""
    spec = job.spec
    if spec.environment is None:
        return []
    from kuberl.runtime.environments.registry import load_environment

    environment = load_environment(spec.environment.name)
    config = Path(model_path) / "config.json"
    limit = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    if limit and spec.data.max_prompt_length + spec.max_response_tokens > int(limit):
        raise RunConfigError(
            f"spec.environment.maxEpisodeTokens: data.maxPromptLength {spec.data.max_prompt_length} + "
            f"maxEpisodeTokens {spec.max_response_tokens} exceed the model's context of {limit} tokens "
            "(max_position_embeddings); lower either"
        )
    return list(environment.tool_schemas)


def make_plan(job: RLJob, output_dir: Path, base_dir: Path, cache_dir: Path) -> RunPlan:
    from transformers import AutoTokenizer

    topology = plan_topology(job.spec)
    spec = job.spec
    locations, tokenizer_at = model_locations(job, base_dir), tokenizer_location(job, base_dir)
    # The driver reads the actor's config and tokenizer itself (not its weights); the other models only have to
    # be resolvable (a bad location fails here, naming its field), and each worker resolves them on its node.
    actor_path = str(locations["actor"].resolve_metadata(cache_dir))
    tokenizer_path = str(tokenizer_at.resolve_metadata(cache_dir))
    for role, location in locations.items():
        if role != "actor":
            location.check(cache_dir)
    from kuberl.runtime.models.lora import lora_problems

    for problem in lora_problems(spec, actor_path):
        raise RunConfigError(problem)
    if spec.rollout.engine == RolloutEngine.VLLM:
        from kuberl.runtime.engines.vllm import tensor_parallel_refusal

        refusal = tensor_parallel_refusal(actor_path, spec.rollout.tensor_parallel_size)
        if refusal is not None:
            raise RunConfigError(refusal)
    # transformers types decode() for a batch too (str | list[str]); the controller decodes one sequence
    tokenizer = cast(Tokenizer, AutoTokenizer.from_pretrained(tokenizer_path))
    tools = environment_tools(job, actor_path)
    dataset = PromptDataset.load(spec.data, tokenizer, base_dir, split="train", tools=tools)
    loader = PromptLoader(
        dataset,
        spec.data.batch_size,
        shuffle=spec.data.shuffle,
        seed=spec.training.seed,
        epochs=spec.training.epochs,
        total_steps=spec.training.total_steps,
    )
    mini_batches = check_mini_batches(job, topology)
    settings = step_settings(spec, mini_batches=mini_batches, actor_world_size=topology.actor.actors)
    validation = None
    if spec.data.validation is not None:
        validation = PromptDataset.load(spec.data, tokenizer, base_dir, split="validation", tools=tools)
    spec.reward = resolved_reward_file(spec.reward, base_dir)  # the workers load it from anywhere
    check_reward_inputs(spec.reward, {"spec.data.train": dataset, "spec.data.validation": validation})
    return RunPlan(
        job,
        output_dir,
        base_dir,
        locations,
        tokenizer_at,
        tokenizer,
        loader,
        topology,
        mini_batches,
        settings,
        validation,
    )


def trainer_groups(topology: Topology) -> list[ActorGroup]:
    """The groups whose ranks split every mini-batch between them: the actor's, and the critic's own."""
    critic = topology.group(Role.CRITIC)
    return [topology.actor] + ([critic] if critic is not None else [])


def check_mini_batches(job: RLJob, topology: Topology) -> int:
    """Mini-batches per step; refuses a mini-batch that a trainer cannot split evenly over its ranks."""
    spec = job.spec
    group_size = spec.algorithm.group_size
    assert group_size is not None  # the API fills it from the preset
    mini_size = spec.algorithm.mini_batch_size or spec.data.batch_size
    rows_per_mini = mini_size * group_size
    for group in trainer_groups(topology):
        if rows_per_mini % group.actors:
            raise RunConfigError(
                f"spec.algorithm.miniBatchSize: a mini-batch of {mini_size} prompts x groupSize {group_size} = "
                f"{rows_per_mini} responses cannot be split evenly over the {group.name}'s {group.actors} ranks "
                f"(spec.resources.{group.pool}); choose sizes whose product is a multiple of the rank count"
            )
    return spec.data.batch_size // mini_size
