"""The worker that holds models: one rank of a worker group, a thin Ray actor over the engines.

A worker hosts the roles its group was given: `actor` (FSDP2 trainer), `rollout` (a generation
engine beside the actor: the colocated hybrid engine), `reference` (forward only) and `critic`
(FSDP2 value model). Roles without a pool of their own are colocated in the actor's workers,
as in verl's ActorRolloutRefWorker.

With LoRA (`spec.models.actor.lora`) the actor is a PEFT model: only its adapters train, sync and
checkpoint (`models.lora`), and a colocated reference of the same model is the actor with its
adapters switched off instead of a second copy of the weights.
"""

import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from kuberl.api import ComputeDType, RLJob, parse_rljob
from kuberl.runtime.batch import RolloutBatch
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.engines.fsdp import (
    FSDPTrainer,
    forget_sharding_caches,
    keeps_frozen_in_compute_dtype,
    offloaded_to_cpu,
    process_group_backend,
)
from kuberl.runtime.engines.inputs import forward_input
from kuberl.runtime.engines.micro_batches import MicroBatching
from kuberl.runtime.engines.updates import UpdateConfig, update_critic, update_policy
from kuberl.runtime.models.dtypes import reference_dtype, rollout_dtype, torch_dtype
from kuberl.runtime.models.layers import compiled_layers
from kuberl.runtime.models.loading import load_trainer_model
from kuberl.runtime.models.lora import load_into, sync_mode, sync_payload
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.workers.group import worker_device

#: Models with weights and optimiser state that checkpoints carry (the reference never changes).
TRAINED_ROLES = ("actor", "critic")


@dataclass(frozen=True)
class WorkerSetup:
    job: dict[str, Any]  # the RLJob manifest
    roles: tuple[str, ...]  # which of actor, rollout, reference, critic this group hosts
    models: dict[str, ModelLocation]  # role -> where its model is (each rank resolves it on its own node)
    tokenizer: ModelLocation
    master_addr: str
    master_port: int
    total_steps: int
    threads: int = 1


@contextmanager
def out_of_memory_names_the_offload(role: str, trainer: FSDPTrainer) -> Iterator[None]:
    """An update of an offloaded model that keeps the model or its gradients on the device for the step
    (`FSDPTrainer.before_pass`) and runs out of device memory says which field holds less."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        if not trainer.reduces_per_step:
            raise
        field = f"models.{role}.offload"
        if trainer.gathers_per_step:
            hint = (
                f"{field} gathers the whole model in the compute dtype and keeps its float32 gradients on the device "
                f"for each update (6 bytes a parameter with bf16); set {field}.perLayer: true and "
                "gradientsOnDevice: true to keep only the gradients (4 bytes a parameter), or perLayer: true alone "
                "to move the model layer by layer and its gradients out at every pass (slower)"
            )
        else:
            hint = (
                f"{field}.gradientsOnDevice keeps the model's float32 gradients on the device for each update (4 "
                "bytes a parameter); set it to false to copy them out at every pass instead (slower)"
            )
        raise torch.OutOfMemoryError(f"{error}\n{hint}") from error


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class ModelWorker:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.trainers: dict[str, FSDPTrainer] = {}
        self.engine: Any = None
        self.job: RLJob | None = None
        self.lora_sync: str | None = None  # what a sync sends (models.lora.sync_mode)
        self.reference_is_base = False  # the reference is the LoRA actor with its adapters off
        self.models: dict[str, ModelLocation] = {}
        self.tokenizer_at: ModelLocation | None = None

    def address(self) -> tuple[str, int]:
        """Where rank 0 serves the process group's rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def node_id(self) -> str:
        """The Ray node (a pod on Kubernetes) this rank runs on: the driver watches whether Ray drains it."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def setup(self, setup: WorkerSetup) -> dict[str, Any]:
        torch.set_num_threads(max(1, setup.threads))
        self.job = parse_rljob(setup.job)
        self.device = worker_device()
        os.environ.update(MASTER_ADDR=setup.master_addr, MASTER_PORT=str(setup.master_port))
        if not dist.is_initialized():
            dist.init_process_group(
                process_group_backend(self.device.type),
                rank=self.rank,
                world_size=self.world_size,
                device_id=None,
            )
        from transformers import AutoTokenizer

        self.models, self.tokenizer_at = setup.models, setup.tokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(setup.tokenizer.resolve())
        spec = self.job.spec
        started = time.perf_counter()
        self.lora_sync = sync_mode(spec)
        if "actor" in setup.roles:
            actor = spec.models.actor
            self.trainers["actor"] = self._trainer(
                setup.models["actor"],
                actor.dtype.value,
                actor.optim,
                setup.total_steps,
                gradient_checkpointing=actor.gradient_checkpointing,
                lora=actor.lora,
                offload=actor.offload.params,
                offload_per_layer=actor.offload.per_layer,
                offload_gradients_on_device=actor.offload.gradients_on_device,
            )
        self.reference_is_base = (
            "actor" in setup.roles
            and spec.models.actor.lora is not None
            and setup.models["reference"].uri == setup.models["actor"].uri
        )
        if "reference" in setup.roles and not self.reference_is_base:
            reference = spec.models.reference
            self.trainers["reference"] = self._trainer(
                setup.models["reference"],
                reference_dtype(spec),
                None,
                0,
                offload=reference is not None and reference.offload.params,
            )
        if "critic" in setup.roles and spec.models.critic is not None:
            critic = spec.models.critic
            self.trainers["critic"] = self._trainer(
                setup.models["critic"],
                critic.dtype.value,
                critic.optim,
                setup.total_steps,
                critic=True,
                gradient_checkpointing=critic.gradient_checkpointing,
                offload=critic.offload.params,
                offload_per_layer=critic.offload.per_layer,
                offload_gradients_on_device=critic.offload.gradients_on_device,
            )
        if "rollout" in setup.roles:
            self.engine = self._rollout_engine(str(setup.models["actor"].resolve()))
        return {"rank": self.rank, "device": str(self.device), "seconds": time.perf_counter() - started}

    def hosted(self) -> dict[str, Any]:
        """What this rank holds and where it runs: its process, its models (with each trainer's parameter dtype
        and whether it recomputes activations in backward), the Ray resources it was given."""
        import ray

        models = sorted(self.trainers) + (["rollout"] if self.engine is not None else [])
        trainers = {
            role: {
                "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
                "gradient_checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", False)),
                "offloaded_to_cpu": offloaded_to_cpu(trainer.model),
                "offload_gathers_per_step": trainer.gathers_per_step,
                "offload_reduces_per_step": trainer.reduces_per_step,
                "padding_free": trainer.padding_free,
                "fused_log_probs": trainer.scoring_head is not None,
                "compiled_layers": compiled_layers(trainer.model),
            }
            for role, trainer in self.trainers.items()
        }
        return {
            "pid": os.getpid(),
            "models": models,
            "trainers": trainers,
            "resources": ray.get_runtime_context().get_assigned_resources(),
        }

    def _trainer(
        self,
        location: ModelLocation,
        dtype: str,
        optim: Any,
        total_steps: int,
        *,
        critic: bool = False,
        gradient_checkpointing: bool = False,
        lora: Any = None,
        offload: bool = False,
        offload_per_layer: bool | None = None,
        offload_gradients_on_device: bool | None = None,
    ) -> FSDPTrainer:
        assert self.job is not None
        torch.manual_seed(self.job.spec.training.seed)  # a new value head starts the same on every rank
        padding_free = self.job.spec.training.padding_free
        model = load_trainer_model(
            location.resolve(), torch_dtype(dtype), critic=critic, padding_free=padding_free,
            device_type=self.device.type,
        )  # fmt: skip
        if optim is None:
            model.requires_grad_(False)
        if lora is not None:
            from kuberl.runtime.models.lora import apply_lora

            if gradient_checkpointing:  # frozen embeddings: checkpointed blocks need an input that wants grads
                model.enable_input_require_grads()
            model = apply_lora(model, lora)
        compute = self.compute_dtype()
        rollout = torch_dtype(rollout_dtype(self.job.spec))
        return FSDPTrainer(
            model,
            world_size=self.world_size,
            device=self.device,
            optim=optim,
            total_steps=total_steps,
            gradient_checkpointing=gradient_checkpointing,
            compute_dtype=compute,
            offload=offload,
            offload_per_layer=offload_per_layer,
            offload_gradients_on_device=offload_gradients_on_device,
            padding_free=padding_free,
            fused_log_probs=self.job.spec.training.fused_log_probs,
            compile_layers=self.job.spec.training.compile,
            frozen_in_compute_dtype=keeps_frozen_in_compute_dtype(
                optim is not None, lora is not None, compute, rollout
            ),
        )

    def compute_dtype(self) -> torch.dtype:
        """spec.training.computeDtype on this worker's device (auto: bfloat16 on GPU, float32 on CPU)."""
        assert self.job is not None
        chosen = self.job.spec.training.compute_dtype
        if chosen == ComputeDType.AUTO:
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return torch_dtype(chosen.value)

    def _rollout_engine(self, path: str) -> Any:
        from kuberl.runtime.engines import build_rollout_engine

        assert self.job is not None
        return build_rollout_engine(self.job.spec, path, self.tokenizer, self.device)

    # -- stages -------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        return self.engine.generate(prompts, params)

    def compute_logprobs(
        self,
        batch: RolloutBatch,
        role: str,
        temperature: float,
        micro_batch_size: int,
        max_tokens: int | None = None,
        sum_pi_squared: bool = False,
    ) -> Any:
        """(n, R) this shard's log-probs under `role`'s model; with `sum_pi_squared` (the actor's old-log-prob pass
        when the estimator reads it) the pair (log-probs, sum_v pi(v)^2), from the same pass."""
        if sum_pi_squared:
            batching = MicroBatching(micro_batch_size, max_tokens)
            scores = self.trainers[role].scores(forward_input(batch), temperature, batching, sum_pi_squared=True)
            return scores.logprobs, scores.sum_pi_squared
        if role == "reference" and self.reference_is_base:
            return self.trainers["actor"].logprobs(
                forward_input(batch), temperature, micro_batch_size, base_only=True, max_tokens=max_tokens
            )
        return self.trainers[role].logprobs(forward_input(batch), temperature, micro_batch_size, max_tokens=max_tokens)

    def compute_values(self, batch: RolloutBatch, micro_batch_size: int, max_tokens: int | None = None) -> Any:
        return self.trainers["critic"].values(forward_input(batch), micro_batch_size, max_tokens)

    def update_actor(self, batch: RolloutBatch, config: UpdateConfig) -> tuple[dict[str, float], Any]:
        """The update's metrics, and with `config.on_policy` this shard's behaviour log-probs (n, R)."""
        with out_of_memory_names_the_offload("actor", self.trainers["actor"]):
            metrics = update_policy(self.trainers["actor"], batch, config)
        return metrics, batch.old_logprobs if config.on_policy else None

    def update_critic(self, batch: RolloutBatch, config: UpdateConfig) -> dict[str, float]:
        with out_of_memory_names_the_offload("critic", self.trainers["critic"]):
            return update_critic(self.trainers["critic"], batch, config)

    def sleep_engine(self) -> dict[str, float]:
        """The colocated engine gives its device memory to the trainer until the next sync (a no-op off the GPU).

        Level 2 (weights dropped too) when the sync reloads every weight; level 1 (weights offloaded to the host)
        when it brings only LoRA's adapters or the blocks they touch, which leaves the base weights as they were.
        """
        level = 2 if self.lora_sync is None else 1
        return {"engine/sleep_freed_bytes": float(self.engine.sleep(level))}

    def sync_weights(self) -> dict[str, float]:
        """Load the actor's weights into the colocated engine in place, one gathered tensor at a time
        (with LoRA: its adapters, or the blocks they touch merged; see models.lora), then wake the engine's
        KV cache: the weights come back before they are written, the cache after, so the two never coexist
        with the trainer's gathers on the device."""
        started = time.perf_counter()
        self.engine.wake_up(("weights",))
        loaded = load_into(self.engine, self.lora_sync, sync_payload(self.trainers["actor"], self.lora_sync))
        self.engine.wake_up(("kv_cache",))
        return {"sync/bytes": float(loaded), "sync/seconds": time.perf_counter() - started}

    def publish_weights(self, bucket_mb: int) -> list[Any] | None:
        """Separate mode: the actor's weights into Ray's object store in buckets (rank 0 returns the refs).

        Every rank iterates the gathers; only rank 0 keeps and stores the full tensors, one bucket at a time.
        """
        from kuberl.runtime.workers.rollout_worker import put_weight_buckets

        weights = sync_payload(self.trainers["actor"], self.lora_sync)
        if self.rank == 0:
            return put_weight_buckets(weights, bucket_mb)
        for _ in weights:
            pass
        return None

    def probe_logprobs(self, prompt: list[int], response: list[int], temperature: float) -> dict[str, list[float]]:
        """The same response scored by the trainer and by the engine (for rollout.verifySync)."""
        width = len(prompt)
        ids = torch.tensor([prompt + response])
        batch = RolloutBatch(
            prompt_ids=ids[:, :width],
            prompt_mask=torch.ones_like(ids[:, :width]),
            response_ids=ids[:, width:],
            response_mask=torch.ones_like(ids[:, width:], dtype=torch.float32),
            group_index=torch.zeros(1).long(),
        )
        # in the weights' own precision: the probe checks that the engine holds the trainer's weights
        scored = self.trainers["actor"].logprobs(forward_input(batch), temperature, 1, full_precision=True)
        trainer = scored[0].tolist()
        engine = self.engine.response_logprobs(prompt, response, temperature) if self.engine is not None else []
        return {"trainer": trainer, "engine": engine}

    def save_checkpoint(self, location: str) -> None:
        """This rank's share of every trained model (collective; see kuberl.runtime.checkpoint)."""
        from kuberl.runtime.checkpoint import save_trainer_state

        for role in TRAINED_ROLES:
            if role in self.trainers:
                save_trainer_state(self.trainers[role], location, role, self.rank)

    def load_checkpoint(self, location: str) -> None:
        """Load every trained model (resharded to this world size), then refresh the colocated engine."""
        from kuberl.runtime.checkpoint import load_trainer_state

        for role in TRAINED_ROLES:
            if role in self.trainers:
                load_trainer_state(self.trainers[role], location, role, self.rank)
        if self.engine is not None:
            load_into(self.engine, self.lora_sync, sync_payload(self.trainers["actor"], self.lora_sync))

    def export_hf(self, checkpoint_uri: str, directory: str) -> str | None:
        """The final actor as a Hugging Face folder, written by rank 0 (the pod that trained it has the memory
        for a full copy; the controller's may not). A full model comes from the final checkpoint
        (kuberl.runtime.checkpoint.export_hf); a LoRA actor's adapter, which that refuses, from the trainer.
        The base model's config and the tokenizer are read from this node's copies (resolved at setup)."""
        assert self.job is not None and self.tokenizer_at is not None
        base_model = str(self.models["actor"].resolve())
        if self.job.spec.models.actor.lora is not None:
            return export_lora_actor(self, directory, base_model)  # collective: every rank gathers
        if self.rank != 0:
            return None
        from kuberl.runtime.checkpoint import export_hf

        return str(export_hf(checkpoint_uri, base_model, directory, tokenizer_path=str(self.tokenizer_at.resolve())))

    def shutdown(self) -> bool:
        """The colocated engine stopped (a split one removes its shared memory), then the process group.

        True when this process can host another run (group.WarmWorkers): not after vLLM ran in it, whose
        in-process engine leaves state of its own behind (its parallel groups, its compilation config), and only
        once DTensor forgot this group's meshes (forget_sharding_caches: else, at another rank, the next run's
        checkpoints would place its shards at this run's offsets)."""
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        self.engine = None
        forgotten = forget_sharding_caches()  # while the group lives
        if dist.is_initialized():  # vLLM's teardown may have destroyed it already
            dist.destroy_process_group()
        return forgotten and "vllm" not in sys.modules

    def reset(self, rank: int, world_size: int) -> None:
        """This process as a new worker, rank `rank` of `world_size`: what `__init__` makes (WarmWorkers)."""
        self.__dict__.clear()
        self.__init__(rank, world_size)  # type: ignore[misc]  # the same fields a new actor starts with


def export_lora_actor(worker: ModelWorker, directory: str, source_path: str) -> str | None:
    """The LoRA actor's adapter as a PEFT folder, and with lora.exportMerged the merged model at
    <directory>-merged (paths or object-store URIs): every rank gathers the adapter, rank 0 writes."""
    from kuberl.runtime.checkpoint.export import staged_folder
    from kuberl.runtime.models.lora import save_adapter

    assert worker.job is not None
    lora = worker.job.spec.models.actor.lora
    assert lora is not None
    adapter = [(name, t.detach().cpu().clone()) for name, t in sync_payload(worker.trainers["actor"], "adapter")]
    if worker.rank != 0:
        return None
    with ExitStack() as published:  # both folders are published once both are written
        folder = published.enter_context(staged_folder(directory))
        merged = published.enter_context(staged_folder(f"{directory}-merged")) if lora.export_merged else None
        merged_folder = str(merged) if merged is not None else None
        save_adapter(adapter, lora, source_path, str(folder), merged_folder, worker.models["actor"].uri)
        for written in (folder, merged):
            if written is not None:
                worker.tokenizer.save_pretrained(written)
    return directory
