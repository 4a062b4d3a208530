"""The rollout worker: one replica of the separate-mode rollout pool (`rollout.placement: separate`).

A plain class; the rollout pool (runtime/pools/rollout.py) wraps it with `ray.remote`. Each replica holds a
whole engine (vLLM or HF) of its own and no trainer. Weights reach it from the actor through
Ray's object store, in buckets, after every update:

    actor rank 0   refs = put_weight_buckets(trainer.full_tensors(), spec.rollout.sync_bucket_mb)
                   (every actor rank iterates full_tensors: each step is an all-gather; only rank 0 puts)
    controller     pool.load(refs, version): every replica runs load_weights_from(refs, version)
                   (runtime/pools/rollout.py); the pool keeps `refs` for replicas that join until the
                   next sync replaces them, and the object store then frees the old buckets
    each replica   fetches one bucket at a time and streams its tensors into the engine in place

A bucket is a list of (Hugging Face parameter name, CPU tensor) pairs of at most `sync_bucket_mb`
(a single larger tensor travels alone). The object store holds one copy of the model between syncs (the
newest, for replicas that join), two during one; a replica holds one bucket plus what its engine
buffers (one layer for vLLM).

Every load carries a weight version (the training step that produced the weights). A replica
answers `generate` only for the version it holds, so a rollout batch never mixes policies; while
a load is under way it holds no version at all.
"""

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from kuberl.api import parse_rljob
from kuberl.runtime.engines.base import Generation, SamplingParams
from kuberl.runtime.models.lora import load_into, sync_mode
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.workers.group import worker_device

#: (name, tensor) pairs that travel together through the object store.
WeightBucket = list[tuple[str, Tensor]]


class StaleWeightsError(RuntimeError):
    """A replica was asked to generate (or score) with weights it does not hold."""


def weight_buckets(weights: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[WeightBucket]:
    """Consecutive named tensors in lists of at most `bucket_bytes`, in order; a larger tensor goes alone.

    Example: sizes 4, 4, 4, 16 bytes with bucket_bytes 8 -> [[a, b], [c], [d]].
    """
    bucket: WeightBucket = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def put_weight_buckets(weights: Iterable[tuple[str, Tensor]], bucket_mb: int) -> list[Any]:
    """Copies named tensors into Ray's object store bucket by bucket; returns the buckets' ObjectRefs.

    Only one bucket is held in this process at a time (the generator pulls the next gather after
    the previous bucket is stored).
    """
    import ray

    cpu = ((name, tensor.detach().to("cpu")) for name, tensor in weights)
    return [ray.put(bucket) for bucket in weight_buckets(cpu, bucket_mb << 20)]


def stream_buckets(buckets: Sequence[Any]) -> Iterator[tuple[str, Tensor]]:
    """The tensors of each bucket in order; an ObjectRef is fetched only when its turn comes."""
    for bucket in buckets:
        if isinstance(bucket, list):
            tensors = bucket
        else:
            import ray

            tensors = ray.get(bucket)
        yield from tensors
        del tensors


class RolloutWorker:
    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank = rank
        self.world_size = world_size
        self.engine: Any = None
        self.weight_version: int | None = None  # None: no engine yet, or a load is under way or failed
        self.lora_sync: str | None = None  # what the actor sends (models.lora.sync_mode): weights or an adapter

    def setup(
        self, job_manifest: dict[str, Any], model: ModelLocation, tokenizer_at: ModelLocation, threads: int = 1
    ) -> dict:
        """Builds the engine `spec.rollout.engine` names with `model` (weight version 0), resolved on this node."""
        from transformers import AutoTokenizer

        from kuberl.runtime.engines import build_rollout_engine

        started = time.perf_counter()
        torch.set_num_threads(max(1, threads))
        spec = parse_rljob(job_manifest).spec
        self.lora_sync = sync_mode(spec)
        device = worker_device()
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_at.resolve())
        self.engine = build_rollout_engine(spec, str(model.resolve()), tokenizer, device)
        self.weight_version = 0
        return {"rank": self.rank, "device": str(device), "seconds": time.perf_counter() - started}

    def _require(self, version: int, what: str) -> None:
        if self.weight_version != version:
            held = f"weight version {self.weight_version}"
            if self.weight_version is None:
                held = "no weights (a load is under way or failed)"
            raise StaleWeightsError(
                f"rollout replica {self.rank}: asked to {what} with weight version {version} but it holds {held}; "
                "load_weights_from(buckets, version) must finish on every replica first"
            )

    def generate(self, prompts: list[list[int]], params: SamplingParams, version: int) -> list[list[Generation]]:
        """`params.n` generations per prompt with the weights of `version`; refuses any other version."""
        self._require(version, "generate")
        return self.engine.generate(prompts, params)

    def response_logprobs(
        self, prompt: list[int], response: list[int], temperature: float, version: int
    ) -> list[float]:
        """The engine's log-probs of `response` (the rollout.verifySync probe), with the weights of `version`."""
        self._require(version, "score a probe")
        return self.engine.response_logprobs(prompt, response, temperature)

    def load_weights_from(self, buckets: Sequence[Any], version: int) -> dict[str, float]:
        """Loads weight buckets (ObjectRefs, or the buckets themselves) in place and takes on `version`."""
        if self.weight_version is not None and version < self.weight_version:
            raise StaleWeightsError(
                f"rollout replica {self.rank}: holds weight version {self.weight_version}, refuses older {version}"
            )
        started = time.perf_counter()
        self.weight_version = None  # half-loaded weights belong to no version
        loaded = load_into(self.engine, self.lora_sync, stream_buckets(buckets))
        self.weight_version = version
        return {"sync/bytes": float(loaded), "sync/seconds": time.perf_counter() - started, "sync/version": version}

    def shutdown(self) -> None:
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        self.engine, self.weight_version = None, None
