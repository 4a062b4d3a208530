"""LoRA adapters from memory into vLLM: the `"adapter"` weight sync of a LoRA run (`models.lora`).

vLLM serves LoRA adapters (`LLM(enable_lora=True)`, `generate(..., lora_request=...)`) but reads
them only from a folder (`WorkerLoRAManager._load_adapter` -> `LoRAModel.from_local_checkpoint`).
As verl does (`TensorLoRARequest` and `VLLMHijack` in verl/utils/vllm), a request subclass carries
the tensors and the PEFT config, and the worker's loader, when it meets one, builds the adapter
with `LoRAModel.from_lora_tensors` — the function `from_local_checkpoint` ends in — instead of
reading files; other requests go to vLLM's own loader. The engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the request and its tensors are handed over as Python
objects, never serialized. Where this departs from verl:

- The tensors are cloned on the way in. vLLM folds the scaling into B in place (`lora_b *=
  scaling` in `LoRALayerWeights.optimize`), and a tensor that is the trainer's own parameter (a
  single CPU rank keeps the plain module) would have its B multiplied on every sync.
- One adapter id, reloaded in place (`load_inplace=True`) at every sync, instead of a new id per
  version: the engine never holds two versions, and the prefix cache is reset after each load
  (cached KV blocks of the old adapter must not serve the new one).
- Names are resolved with vLLM's rename-only mapper (`get_rename_mapper()`), as vLLM's own loader
  does: the full `hf_to_vllm_mapper` rewrites q_proj to the fused qkv_proj before packing and the
  adapter lands in the wrong slices.

Works on vLLM's CPU build (0.32: `PunicaWrapperCPU`) and on CUDA, through the same calls.
"""

from collections.abc import Iterable
from typing import Any

from torch import Tensor

#: The one adapter a kuberl engine serves: the actor being trained.
ADAPTER_NAME, ADAPTER_ID = "kuberl-actor", 1
#: LoRARequest requires a path; this one is never read (the tensors travel in the request).
IN_MEMORY_PATH = "kuberl://in-memory-adapter"
#: Ranks vLLM's LoRAConfig accepts for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

_installed = False


def max_lora_rank_for(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that fits adapters of `rank` (e.g. 4 -> 8, 24 -> 32)."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"spec.models.actor.lora.rank {rank}: vLLM serves adapters up to rank {VLLM_MAX_LORA_RANKS[-1]}")


def _request_class() -> type:
    import msgspec
    from vllm.lora.request import LoRARequest

    class TensorLoRARequest(LoRARequest):  # type: ignore[misc]
        """A LoRARequest whose adapter is in memory: PEFT config and tensors (saved-adapter names)."""

        peft_config: dict = msgspec.field(default_factory=dict)
        lora_tensors: dict = msgspec.field(default_factory=dict)

    return TensorLoRARequest


_TENSOR_REQUEST: type | None = None


def tensor_request_class() -> type:
    global _TENSOR_REQUEST
    if _TENSOR_REQUEST is None:
        _TENSOR_REQUEST = _request_class()
    return _TENSOR_REQUEST


def install_tensor_loader() -> None:
    """Teach vLLM's worker LoRA manager to build adapters from a TensorLoRARequest (idempotent)."""
    global _installed
    if _installed:
        return
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.worker_manager import WorkerLoRAManager

    request_class: Any = tensor_request_class()
    load_from_folder = WorkerLoRAManager._load_adapter

    def load_adapter(self: Any, lora_request: Any) -> Any:
        if not isinstance(lora_request, request_class):
            return load_from_folder(self, lora_request)
        helper = PEFTHelper.from_dict(lora_request.peft_config)
        helper.validate_legal(self.lora_config)
        model = self._adapter_manager.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        return self._lora_model_cls.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id,
            tensors=lora_request.lora_tensors,
            peft_helper=helper,
            device="cpu",
            dtype=self.lora_config.lora_dtype,
            model_vocab_size=self.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )

    WorkerLoRAManager._load_adapter = load_adapter  # type: ignore[method-assign]
    _installed = True


def adapter_request(weights: Iterable[tuple[str, Tensor]], peft_config: dict[str, Any]) -> tuple[Any, int]:
    """A reload-in-place request carrying cloned copies of `weights`, and their size in bytes."""
    tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    request = tensor_request_class()(
        lora_name=ADAPTER_NAME,
        lora_int_id=ADAPTER_ID,
        lora_path=IN_MEMORY_PATH,
        load_inplace=True,
        peft_config=peft_config,
        lora_tensors=tensors,
    )
    return request, size


def serving_request() -> Any:
    """The request generation names the adapter by (already loaded: nothing is read)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=ADAPTER_NAME, lora_int_id=ADAPTER_ID, lora_path=IN_MEMORY_PATH)
