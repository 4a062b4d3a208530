"""Start-up: everything that can be checked before a Ray actor exists, checked.

`make_plan` resolves models, loads and tokenizes the data, and checks the batch arithmetic
against the pools' sizes. Whatever is wrong surfaces here, naming the field or file, before
any minute of compute is spent.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.api import RLJob
from kuberl.runtime.data import PromptDataset, PromptLoader
from kuberl.runtime.models.resolve import resolve_model_path


class RunConfigError(ValueError):
    """A job that cannot run as specified; the message names the field or file."""


@dataclass
class RunPlan:
    job: RLJob
    output_dir: Path
    base_dir: Path
    model_paths: dict[str, str]  # role -> local folder
    tokenizer: Any
    loader: PromptLoader
    actor_world_size: int
    mini_batches: int
    validation: PromptDataset | None = None  # data.validation, tokenized

    @property
    def total_steps(self) -> int:
        return self.loader.total_steps


def _resolve(path: str, base_dir: Path, cache_dir: Path, field: str) -> str:
    if "://" not in path and not Path(path).is_absolute():
        path = str((base_dir / path).resolve())
    return str(resolve_model_path(path, cache_dir, field))


def make_plan(job: RLJob, output_dir: Path, base_dir: Path, cache_dir: Path) -> RunPlan:
    from transformers import AutoTokenizer

    spec = job.spec
    actor_path = _resolve(spec.models.actor.path, base_dir, cache_dir, "spec.models.actor.path")
    paths = {"actor": actor_path, "reference": actor_path}
    if spec.models.reference is not None and spec.models.reference.path is not None:
        paths["reference"] = _resolve(spec.models.reference.path, base_dir, cache_dir, "spec.models.reference.path")
    if spec.models.critic is not None:
        critic_path = spec.models.critic.path
        paths["critic"] = (
            _resolve(critic_path, base_dir, cache_dir, "spec.models.critic.path") if critic_path else actor_path
        )
    if spec.reward.model is not None:
        paths["reward"] = _resolve(spec.reward.model.path, base_dir, cache_dir, "spec.reward.model.path")
    from kuberl.runtime.models.lora import lora_problems

    for problem in lora_problems(spec, actor_path):
        raise RunConfigError(problem)
    tokenizer_path = actor_path
    if spec.models.actor.tokenizer:
        tokenizer_path = _resolve(spec.models.actor.tokenizer, base_dir, cache_dir, "spec.models.actor.tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    dataset = PromptDataset.load(spec.data, tokenizer, base_dir, split="train")
    loader = PromptLoader(
        dataset,
        spec.data.batch_size,
        shuffle=spec.data.shuffle,
        seed=spec.training.seed,
        epochs=spec.training.epochs,
        total_steps=spec.training.total_steps,
    )
    world = spec.resources.actor.world_size
    group_size = spec.algorithm.group_size or 1
    mini_size = spec.algorithm.mini_batch_size or spec.data.batch_size
    mini_batches = spec.data.batch_size // mini_size
    rows_per_mini = mini_size * group_size
    if rows_per_mini % world:
        raise RunConfigError(
            f"spec.algorithm.miniBatchSize: a mini-batch of {mini_size} prompts x groupSize {group_size} = "
            f"{rows_per_mini} responses cannot be split evenly over the actor's {world} ranks "
            "(spec.resources.actor); choose sizes whose product is a multiple of the rank count"
        )
    validation = None
    if spec.data.validation is not None:
        validation = PromptDataset.load(spec.data, tokenizer, base_dir, split="validation")
    return RunPlan(job, output_dir, base_dir, paths, tokenizer, loader, world, mini_batches, validation)
