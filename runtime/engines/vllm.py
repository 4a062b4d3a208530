"""The `vllm` rollout engine: a vLLM `LLM` in this process that the trainer's weights stream into in place.

It implements `RolloutEngine` exactly like the `hf` engine (a drop-in), on vLLM's CPU build here and
on GPUs in a cluster. How it departs from verl's vLLM rollout (`vLLMRollout` / `vLLMAsyncRollout`):

- Weight updates go through vLLM's own in-place reload (`collective_rpc("reload_weights",
  weights_iterator=...)`), not verl's `model.load_weights(...)` on the bare model. On the CPU
  backend vLLM repacks every linear layer after loading (oneDNN / SGL packed GEMM weights; the
  `weight` parameter is left empty), so a plain `load_weights` fails (`'Parameter' object has no
  attribute 'weight_loader'`) and, even where it would not, the packed copy would stay stale.
  `reload_weights` restores each layer, loads it, repacks it and copies the result back into the
  original storage, one layer at a time. The iterator is consumed lazily: apart from the tensors of
  the layer being assembled, no second copy of the model exists at any moment (peak extra memory is
  the largest layer rebuilt plus its packed copy: 0.5x the model at 100M, where the tied 32000 x 768
  vocabulary matrix is a quarter of it).
- With tied embeddings the checkpoint names only `embed_tokens.weight`, so reload repacks the
  embedding but never the LM head that shares it; on CPU the head's packed copy would keep the old
  weights. After each reload the head takes over the embedding's freshly packed GEMM
  (`_refresh_shared_gemms`).
- The sync costs what vLLM's CPU GEMMs cost: every linear layer is repacked (oneDNN) in fresh
  memory — about 20x a plain copy of the tensors at 100M parameters here (bench/weight_sync.py).
  Keeping weights unpacked (`F.linear`, vLLM's `_cpu_skip_gemm_dispatch`) makes the sync a single
  in-place copy, but on this machine (AMD EPYC, MKL's fp32 GEMM) it generates 2-3x slower; the
  rollout dominates a step, so the engine keeps vLLM's packed GEMMs.
- The prefix cache is cleared after every load: KV blocks computed with the old weights must not
  serve prompts of the new policy.
- Log-probabilities follow kuberl's convention (`engines.sampling`): log_softmax(logits / T) of the
  sampled token, unfiltered by top-k/top-p (greedy: T = 1). vLLM reports either the raw
  distribution (`raw_logprobs`, T = 1) or the processed one (`processed_logprobs`: scaled *and*
  filtered), fixed per engine. The engine picks `raw_logprobs` when the job samples at T = 1 (exact
  for any top-k/top-p) and `processed_logprobs` otherwise (exact without top-k/top-p). A call that
  neither mode answers exactly (T != 1 with top-k/top-p) is re-scored from full-vocabulary prompt
  log-probs, which is exact but slow; a warning says so once.
- Stopping: vLLM stops at every eos id of the model's generation_config.json (`<|im_end|>` as well
  as `<|endoftext|>` for ChatML models) and at the caller's stop tokens; the hf engine only at the
  tokenizer's eos and the caller's. Stop strings are matched on vLLM's incremental detokenization,
  which holds back incomplete UTF-8 bytes, so a response may run a token past the hf engine's cut.
- Seeds: request i gets a 63-bit seed derived from (params.seed, i); vLLM gives sample j of it
  seed + j, so the same seed and prompts give the same responses, and no two rows of a call share
  a random stream.
- vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the weights iterator is handed over
  as a Python object, not serialized.
- Tensor parallelism on a separate rollout pool (spec.rollout.tensorParallelSize > 1, placement separate):
  the engine core still runs in this process, but vLLM's `mp` executor spawns one worker process per
  shard (`tensor_parallel_arguments`), each on a GPU of the replica's pod, or on CPU a process with
  its share of the replica's cores (`worker_environment`: OMP threads split, and vLLM's core binding
  off, which would pin every worker to cores Ray's other actors use). A weight load is then a
  `collective_rpc` to those processes, whose arguments are pickled to each worker: a lazy generator
  cannot travel, a list can. So a sync goes one decoder layer at a time (`layer_loads`): a list of
  one layer's tensors per call, which each worker unpickles and shards into its own slice, and vLLM's
  layerwise reload rebuilds that layer and puts every other layer back as it was (as for LoRA's
  partial loads). Host memory holds one layer in this process and a copy in each worker at a time:
  a few times the largest layer, not a copy of the model per worker (bench/tensor_parallel_sync.py:
  0.45x the peak of one whole-model call at 2 shards, 100M). The price is a call per layer, and
  vLLM's "Failed to load weights" for every layer a call leaves alone, which the workers drop
  (`_quiet_reload_warnings_in_worker`): a layer never loaded goes unreported there, and
  rollout.verifySync is what catches stale weights. A colocated engine split over trainer ranks (below)
  avoids the pickling, as verl's hybrid engine does. The TP workers are fresh processes, so the patch that must
  reach vLLM's sampler is installed in them after start-up too (`_rank_eagerly_in_worker`); the
  kernel-rebind patch guards against modules this process may hold (flask), which the fresh workers
  do not import.
- Colocated tensor parallelism (rollout.placement colocated, tensorParallelSize N > 1): vLLM's external
  launcher. N consecutive trainer ranks each hold one shard of the engine in their own process, in the
  trainer's torch.distributed group (vLLM adds its tensor-parallel groups to it; `launcher_environment`), so
  the ranks of a group must call the engine together, with the same prompts and seeds (rollout/base.py
  `Engines` sends each group one shard of the step and keeps its first rank's answer). A sync is each rank
  loading the full tensors it gathered from FSDP anyway: vLLM's weight loaders keep the slice of its shard,
  in place, in this process, lazily as for one shard.
- dtype: the engine runs in spec.rollout.dtype (default: the actor's; verl's default is bfloat16), the
  synced weights cast to it on load; spec.rollout.engineArgs reach `LLM` as given (`llm_arguments`).
- On CPU, vLLM's sampler ranks each returned log-prob with a `torch.compile`d helper
  (`batched_count_greater_than`); the engine swaps in the same expression run eagerly
  (`_rank_eagerly`). torch 2.13's inductor emits C++ for the helper's dynamic-shape recompile that
  g++ rejects on this machine ("'at::vec' has not been declared": a crash mid-rollout), and
  compiling it costs seconds at the first request anyway; the eager form's (rows x vocab) mask is
  nothing on CPU.
- At start-up vLLM's CPU platform rebinds its Triton kernels by scanning every module's attributes
  with `hasattr(value, "__dict__")`, which raises on a werkzeug `LocalProxy` (flask's `current_app`,
  present once anything imported flask, e.g. moto or a user's reward server) instead of answering
  False. The engine installs the same scan with that one call guarded (`_rebind_kernels_tolerantly`).
- Sleep mode exists only on CUDA; on CPU `sleep`/`wake_up` are no-ops. A colocated engine sleeps before the
  trainer's passes of every step and wakes in the sync (`ModelWorker.sleep_engine`, `sync_weights`): level 2
  (weights and KV cache dropped) when the sync reloads every weight, as verl does, level 1 (weights offloaded)
  for LoRA's syncs, which leave the base weights as they were; the weights wake before they are written and
  the KV cache after.
- LoRA (`spec.models.actor.lora`): with the "adapter" sync the engine starts with `enable_lora`
  and generates and scores with the one adapter it holds, loaded from memory by `load_adapter`
  (`engines.vllm_lora`); before the first load it serves the base model, which a fresh adapter
  (B = 0) does not change. With the "merged" sync `load_weights` receives only the blocks the
  adapters touch; vLLM's reload keeps every other layer as it is (and would warn about each one,
  so its reload loggers are quietened for those loads).
- Quiet reloads: vLLM's layerwise reload warns "<Layer>: Failed to load weights" for every layer
  the weights iterator names no tensor of, and puts the layer's own tensors back. Two such layers
  are expected on every sync and are not failures: rotary embeddings (their cos/sin cache is
  computed, never in a checkpoint) and an LM head tied to the embedding (the checkpoint names only
  `embed_tokens.weight`; see above). `ExpectedReloadWarnings` drops exactly those records while a
  reload runs; any other layer that loads nothing still warns.
"""

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kuberl.api import RLJobSpec, RolloutPlacement
from kuberl.runtime.engines.base import Generation, SamplingParams, SleepState
from kuberl.runtime.models.dtypes import rollout_dtype
from kuberl.runtime.models.lora import peft_config_dict, sync_mode

log = logging.getLogger(__name__)

#: vLLM's logger of the layerwise reload, and the layers whose "Failed to load weights" is expected there.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
ROTARY_SUFFIX = "RotaryEmbedding"
TIED_HEAD = "ParallelLMHead"

#: KV-cache size on CPU when spec.rollout.kvCacheBytes is not set.
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20
RAW, PROCESSED = "raw_logprobs", "processed_logprobs"


# -- pure helpers ---------------------------------------------------------------------------------
def logprobs_mode_for(temperature: float) -> str:
    """The vLLM `logprobs_mode` whose numbers are kuberl's for a job sampling at `temperature`."""
    return RAW if temperature in (0.0, 1.0) else PROCESSED


def engine_logprobs_are_exact(mode: str, params: SamplingParams) -> bool:
    """Whether vLLM's sampled-token log-probs in `mode` equal log_softmax(logits / T) for this call.

    Greedy (T = 0) scores at T = 1 in every mode. raw = T 1; processed = scaled and top-k/top-p filtered.
    """
    if params.temperature == 0.0:
        return True
    unfiltered = params.top_k is None and params.top_p >= 1.0
    if mode == RAW:
        return params.temperature == 1.0
    return unfiltered


def request_seed(seed: int, prompt_index: int) -> int:
    """A 63-bit seed for prompt `prompt_index` of a call seeded `seed` (vLLM adds j for its sample j)."""
    state = np.random.SeedSequence([int(seed) & (2**64 - 1), prompt_index]).generate_state(2, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def to_vllm_sampling(params: SamplingParams, prompt_index: int) -> Any:
    """vLLM's sampling settings for one prompt of a call: n samples, the sampled token's log-prob each.

    With `params.row_seeds` the prompt's own seed and token budget (multi-turn episodes).
    """
    from vllm import SamplingParams as VLLMSamplingParams

    seed = request_seed(params.seed, prompt_index)
    if params.row_seeds:
        seed = request_seed(params.row_seeds[prompt_index], 0)
    max_tokens = params.max_new_tokens
    if params.row_max_new_tokens:
        max_tokens = params.row_max_new_tokens[prompt_index]
    return VLLMSamplingParams(
        n=params.n,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k is not None else 0,  # 0: no limit
        max_tokens=max_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids),
        seed=seed,
        logprobs=0,  # the sampled token only
        detokenize=bool(params.stop),  # text is needed only to find stop strings
    )


def to_generation(completion: Any, cached_tokens: int = 0) -> Generation:
    """A vLLM CompletionOutput as a Generation: its tokens, each token's log-prob, why it ended."""
    ids = list(completion.token_ids)
    logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids, strict=True)]
    reason = "length" if completion.finish_reason == "length" else "stop"
    return Generation(ids, logprobs, reason, cached_tokens=cached_tokens)


def tempered_logprobs(full: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """log_softmax(logits / T)[target] from log_softmax(logits) over the whole vocabulary.

    Exact, because log_softmax(lp / T) = log_softmax(logits / T) when lp = logits - logsumexp(logits):
    the shift by logsumexp / T cancels.
    """
    scaled = full / temperature if temperature > 0 else full  # (R, V)
    return scaled.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)  # (R,)


def context_length(spec: RLJobSpec, model_path: str) -> int:
    """The longest sequence a request needs (prompt + response or whole episode + the one token a scoring
    request makes).

    Capped at the model's `max_position_embeddings`, which vLLM refuses to exceed.
    """
    wanted = spec.data.max_prompt_length + spec.max_response_tokens + 1
    config = Path(model_path) / "config.json"
    limit = json.loads(config.read_text()).get("max_position_embeddings") if config.is_file() else None
    return min(wanted, int(limit)) if limit else wanted


def tensor_parallel_problem(config: dict[str, Any], size: int) -> str | None:
    """Why a model with this config.json cannot be split `size` ways by vLLM, or None when it can.

    vLLM gives each shard num_attention_heads / size query heads, and num_key_value_heads / size KV
    heads (or, with fewer KV heads than shards, a replica of one KV head per size / kv shards).

    >>> tensor_parallel_problem({"num_attention_heads": 4, "num_key_value_heads": 2}, 2) is None
    True
    >>> tensor_parallel_problem({"num_attention_heads": 6, "num_key_value_heads": 2}, 4)
    'the model has 6 attention heads, which 4 shards cannot split evenly'
    """
    heads = config.get("num_attention_heads")
    if heads is None or size == 1:
        return None
    if heads % size:
        return f"the model has {heads} attention heads, which {size} shards cannot split evenly"
    kv = config.get("num_key_value_heads") or heads
    if (kv % size if kv >= size else size % kv) != 0:
        return f"the model has {kv} key-value heads, which {size} shards can neither split nor replicate evenly"
    return None


def tensor_parallel_refusal(model_path: str, size: int) -> str | None:
    """Why spec.rollout.tensorParallelSize `size` cannot split the model at `model_path` (its config.json),
    naming the field; None when it can. The run's plan asks before any actor starts, the engine again."""
    config = Path(model_path) / "config.json"
    problem = tensor_parallel_problem(json.loads(config.read_text()), size) if config.is_file() else None
    if problem is None:
        return None
    return (
        f"spec.rollout.tensorParallelSize {size}: {problem} ({model_path}); "
        "pick a size that divides the model's attention heads"
    )


#: A checkpoint name's decoder layer (`model.layers.3.mlp.up_proj.weight` -> `model.layers.3`).
DECODER_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def layer_loads(weights: Iterable[tuple[str, Tensor]]) -> Iterator[list[tuple[str, Tensor]]]:
    """Consecutive named tensors grouped by decoder layer (any other tensor by its module), in order.

    Each group holds all a vLLM layer reads (its fused qkv / gate_up projections are one decoder layer's
    tensors), so a reload of one group rebuilds whole layers. A layer whose tensors come apart would be
    rebuilt half loaded, so a name of a group already sent raises.

    >>> names = ["model.embed_tokens.weight", "model.layers.0.a.weight", "model.layers.0.b.weight", "lm_head.weight"]
    >>> [[name for name, _ in group] for group in layer_loads((name, None) for name in names)]
    [['model.embed_tokens.weight'], ['model.layers.0.a.weight', 'model.layers.0.b.weight'], ['lm_head.weight']]
    """
    group: list[tuple[str, Tensor]] = []
    key, sent = None, set()
    for name, tensor in weights:
        match = DECODER_LAYER.match(name)
        owner = match.group(1) if match else name.rpartition(".")[0]
        if owner != key:
            if group:
                yield group
            if owner in sent:
                raise ValueError(f"weights of {owner} come in two runs ({name} after other layers'); send each whole")
            sent.add(owner)
            group, key = [], owner
        group.append((name, tensor))
    if group:
        yield group


def tensor_parallel_arguments(size: int, colocated: bool = False) -> dict[str, Any]:
    """vLLM's `LLM` arguments for an engine split `size` ways: separate, the `mp` executor (a worker process per
    shard); colocated, the external launcher (a shard in each of `size` trainer ranks' processes, which must call
    the engine together)."""
    if size == 1:
        return {}
    return {"tensor_parallel_size": size, "distributed_executor_backend": "external_launcher" if colocated else "mp"}


def external_launcher(ident: str) -> type:
    """vLLM's external launcher, naming its CPU shared memory after `ident`.

    vLLM's CPU communicator names each tensor-parallel group's shared-memory segments after the executor's init
    method, which is "env://" for every external launcher: two jobs on one host would open each other's segments,
    and a job killed before it exits leaves segments that make the next one fail (EEXIST). `ident` (the trainer
    group's rendezvous, unique on the host) goes into the name instead; torch.distributed is initialised already,
    so vLLM reads the init method for nothing else (vllm/v1/worker/cpu_worker.py init_device, vLLM 0.32)."""
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    class NamedExternalLauncher(ExecutorWithExternalLauncher):
        def _distributed_args(self) -> tuple[str, int, int]:
            _, rank, local_rank = super()._distributed_args()
            return f"env:{ident}", rank, local_rank

    return NamedExternalLauncher


def shared_memory_ident() -> str:
    """A name for this job's colocated engine's shared memory, the same in every rank of the trainer's group and
    unique on the host: the group's rendezvous (MASTER_ADDR:MASTER_PORT, a port bound on the host)."""
    address = os.environ.get("MASTER_ADDR", "localhost").replace(".", "-").replace(":", "-")
    return f"kuberl-{address}-{os.environ.get('MASTER_PORT', '0')}"


def socket_folder(pid: int | None = None) -> Path:
    """The folder of process `pid`'s (default: this one's) vLLM IPC sockets, given to vLLM as VLLM_RPC_BASE_PATH.

    vLLM binds its ZeroMQ sockets (the message queues of a split engine) at `<VLLM_RPC_BASE_PATH>/<uuid4>`,
    by default straight in the temporary folder, and a socket's file stays there whenever the process that bound
    it does not close it: the mp executor's shards are terminated, a colocated rank's actor is killed. That was
    22 files in /tmp per run of test_tensor_parallel.py. In a folder of the engine's own, `shutdown` removes them
    all, and the next engine on the host removes what a killed process left (`remove_abandoned_socket_folders`).
    The path stays far below the 107 bytes a Unix socket's may have."""
    return Path(tempfile.gettempdir()) / f"kuberl-vllm-{os.getpid() if pid is None else pid}"


def remove_abandoned_socket_folders() -> list[Path]:
    """Removes the socket folders of processes that are gone, and returns them. A folder is left alone while
    its process lives, or while any socket in it still accepts a connection (a process of another PID namespace
    sharing this temporary folder)."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob("kuberl-vllm-*"):
        pid = folder.name.removeprefix("kuberl-vllm-")
        if not pid.isdigit() or _process_exists(int(pid)) or any(is_listening(path) for path in folder.iterdir()):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def is_listening(path: Path) -> bool:
    """Whether `path` is a Unix socket something still listens on (a stale one refuses the connection)."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def launcher_environment(rank: int, world_size: int) -> dict[str, str]:
    """What vLLM's external launcher reads of the process group it joins: this trainer rank and the world. The
    group itself is the trainer's (torch.distributed is initialised already, so vLLM adds its tensor-parallel
    groups to it); each rank sees one device, so its local rank is 0 (the rank's cuda:0, or the CPU)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0"}


def worker_environment(size: int, cuda: bool, threads: int) -> dict[str, str]:
    """Environment the `mp` executor's worker processes start with, for `size` shards and `threads` cores.

    On CPU each shard gets its share of the replica's threads, and vLLM's own core binding (which pins
    workers to cores it picks, whatever else runs there) is off. On GPU vLLM places the workers itself.
    """
    if size == 1 or cuda:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, threads // size))}


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ while the block runs (the workers it spawns inherit them), then as before."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _count_at_least(x: Tensor, values: Tensor) -> Tensor:
    """Per row of x (B, V), how many entries are >= values (B, 1): vLLM's log-prob rank, eagerly."""
    return (x >= values).sum(-1)  # (B,)


def _rank_eagerly() -> None:
    """Replace vLLM's compiled rank helper with `_count_at_least` (see the module docstring)."""
    from vllm.v1.sample import sampler

    setattr(sampler, "batched_count_greater_than", _count_at_least)  # noqa: B010 - not exported by vLLM


def _rank_eagerly_in_worker(worker: Any) -> None:
    """`_rank_eagerly` inside one of vLLM's worker processes (called through collective_rpc)."""
    _rank_eagerly()


def _rebind_kernels_tolerantly() -> None:
    """vLLM's `triton_utils.dispatcher._rebind_kernels`, skipping values that raise when inspected."""
    from vllm.triton_utils import dispatcher

    def rebind(overrides: list[tuple[Any, Any]]) -> None:
        # Inspecting every attribute of every module touches deprecated ones (torch.distributed.reduce_op),
        # whose FutureWarning is about that attribute's users, not about this scan.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            _rebind(overrides)

    def _rebind(overrides: list[tuple[Any, Any]]) -> None:
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            for attr, value in list((namespace or {}).items()):
                wrapper = next((w for original, w in overrides if value is original), None)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    owned = vars(value).get("kernel") if hasattr(value, "__dict__") else None
                except Exception:  # noqa: BLE001 - a proxy with nothing behind it (flask outside a request)
                    continue
                wrapper = next((w for original, w in overrides if owned is original), None)
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    setattr(dispatcher, "_rebind_kernels", rebind)  # noqa: B010 - a private vLLM function


# -- inside vLLM's worker (called through collective_rpc) -------------------------------------------
def _refresh_shared_gemms(worker: Any) -> int:
    """Point every module that shares its weight with an earlier one (a tied LM head) at that module's GEMM.

    Returns how many modules were refreshed. On CPU each module keeps its own packed copy of its
    weight for its GEMM (`cpu_linear`); reload rebuilds the copy of the module the checkpoint
    names (the embedding) but never that of the head sharing it. The embedding's packed copy is
    the head's matrix, so the head takes it over instead of packing the same weight again.
    """
    model = getattr(worker, "worker", worker).model_runner.get_model()
    first_owner: dict[int, torch.nn.Module] = {}
    refreshed = 0
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None or weight.numel() == 0:
            continue
        owner = first_owner.setdefault(id(weight), module)
        if owner is module:
            continue
        if hasattr(owner, "cpu_linear"):
            module.cpu_linear = owner.cpu_linear
        else:
            module.quant_method.process_weights_after_loading(module)
        refreshed += 1
    return refreshed


def _quiet_reload_warnings_in_worker(worker: Any) -> None:
    """In a tensor-parallel worker process, for its lifetime: only errors from vLLM's reload.

    A sync reloads one layer per call (`layer_loads`), and each call warns about every other layer
    ("Failed to load weights", "weights were not loaded"): warnings that say nothing there.
    """
    logging.getLogger("vllm.model_executor.model_loader.reload").setLevel(logging.ERROR)


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" for layers with nothing to load (see the module docstring).

    >>> record = logging.LogRecord(RELOAD_LOGGER, logging.WARNING, "", 0, "%s: Failed to load weights", ("X",), None)
    >>> ExpectedReloadWarnings(tied_head=True).filter(record)
    True
    >>> record.args = ("RotaryEmbedding",)
    >>> ExpectedReloadWarnings(tied_head=True).filter(record)
    False
    """

    def __init__(self, tied_head: bool) -> None:
        super().__init__()
        self.tied_head = tied_head

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0] if isinstance(record.args, tuple) else record.args)
        return not (layer.endswith(ROTARY_SUFFIX) or (self.tied_head and layer == TIED_HEAD))


def ties_embeddings(model_path: str) -> bool:
    """Whether the model's config.json ties the LM head to the input embedding (transformers' default: yes)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", True))


def llm_arguments(spec: RLJobSpec, model_path: str, cuda: bool) -> dict[str, Any]:
    """The keyword arguments of vLLM's `LLM` for `spec`: what kuberl sets, then spec.rollout.engineArgs.

    The api refuses engineArgs that name anything set here (kuberl.api.engine_args.SET_BY_KUBERL).
    """
    rollout = spec.rollout
    arguments: dict[str, Any] = {
        "model": model_path,
        "dtype": rollout_dtype(spec),
        "seed": spec.training.seed,
        "max_model_len": context_length(spec, model_path),
        "logprobs_mode": logprobs_mode_for(rollout.temperature),
        "max_logprobs": -1,  # scoring at T != 1 reads the whole vocabulary's prompt log-probs
        "generation_config": "vllm",  # neutral defaults (eos ids still come from generation_config.json)
        "enforce_eager": not cuda,
        "enable_sleep_mode": cuda,
        **tensor_parallel_arguments(rollout.tensor_parallel_size, rollout.placement == RolloutPlacement.COLOCATED),
    }
    if cuda:
        arguments["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    kv_bytes = rollout.kv_cache_bytes or (None if cuda else DEFAULT_CPU_KV_CACHE_BYTES)
    if kv_bytes is not None:
        arguments["kv_cache_memory_bytes"] = kv_bytes
    lora = spec.models.actor.lora if sync_mode(spec) == "adapter" else None
    if lora is not None:
        from kuberl.runtime.engines.vllm_lora import max_lora_rank_for

        arguments.update(enable_lora=True, max_lora_rank=max_lora_rank_for(lora.rank), max_loras=1)
    clashes = sorted(set(arguments) & set(rollout.engine_args))
    if clashes:  # the api refuses these; a manifest that bypassed it must not override kuberl's settings silently
        raise ValueError(f"spec.rollout.engineArgs: {', '.join(clashes)} are set by kuberl")
    return {**arguments, **rollout.engine_args}


class VLLMRolloutEngine:
    """A vLLM engine behind `RolloutEngine`; build it with `create`."""

    def __init__(
        self,
        llm: Any,
        device: torch.device,
        logprobs_mode: str,
        adapter_config: dict[str, Any] | None = None,
        partial_loads: bool = False,
        tied_head: bool = False,
        shards: int = 1,
        colocated: bool = False,
    ) -> None:
        self.llm = llm
        self.device = device
        self.logprobs_mode = logprobs_mode
        self.adapter_config = adapter_config  # PEFT config of the LoRA adapter this engine serves, if any
        self.adapter: Any = None  # the LoRARequest generation names, once an adapter is loaded
        self.partial_loads = partial_loads  # LoRA's merged sync: each load brings only the touched blocks
        self._reload_filter = ExpectedReloadWarnings(tied_head)
        self.shards = shards  # spec.rollout.tensorParallelSize: > 1, the model is split over processes
        #: the shards run in worker processes of this engine's own (separate placement's mp executor); colocated,
        #: each is in a trainer rank's process (the external launcher) and this one holds only its own
        self.worker_processes = shards > 1 and not colocated
        self.sleep_state = SleepState()
        self._warned_rescoring = False

    @classmethod
    def create(cls, spec: RLJobSpec, model_path: str, device: torch.device) -> "VLLMRolloutEngine":
        """An engine for `spec` holding the model at `model_path`, on `device` (cpu or cuda)."""
        shards = spec.rollout.tensor_parallel_size
        refusal = tensor_parallel_refusal(model_path, shards)
        if refusal is not None:
            raise ValueError(refusal)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: weights stream as Python objects
        from vllm import LLM

        cuda = torch.device(device).type == "cuda"
        lora = spec.models.actor.lora if sync_mode(spec) == "adapter" else None
        if lora is not None:
            from kuberl.runtime.engines.vllm_lora import install_tensor_loader

            install_tensor_loader()
        if not cuda:
            _rank_eagerly()
            _rebind_kernels_tolerantly()
        arguments = llm_arguments(spec, model_path, cuda)
        colocated = shards > 1 and spec.rollout.placement == RolloutPlacement.COLOCATED
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        if colocated:  # the trainer's process group, which this rank's shard joins
            import torch.distributed as dist

            environment = launcher_environment(dist.get_rank(), dist.get_world_size())
            arguments["distributed_executor_backend"] = external_launcher(shared_memory_ident())
        else:
            environment = worker_environment(shards, cuda, threads)
        remove_abandoned_socket_folders()
        socket_folder().mkdir(mode=0o700, exist_ok=True)
        environment["VLLM_RPC_BASE_PATH"] = str(socket_folder())  # the mp executor's shards inherit it
        try:
            with _environment(environment):
                llm = LLM(**arguments)
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads process-wide with a no-op and drops to one
            # thread; this process also trains, so the caller's setting comes back.
            torch.set_num_threads = set_threads
            set_threads(threads)
        if shards > 1 and not colocated:  # the worker processes log and sample on their own
            llm.collective_rpc(_quiet_reload_warnings_in_worker)
            if not cuda:
                llm.collective_rpc(_rank_eagerly_in_worker)
        adapter_config = peft_config_dict(lora) if lora is not None else None
        return cls(
            llm,
            torch.device(device),
            arguments["logprobs_mode"],
            adapter_config,
            partial_loads=sync_mode(spec) == "merged",
            tied_head=ties_embeddings(model_path),
            shards=shards,
            colocated=colocated,
        )

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """`params.n` generations for each prompt, in prompt order."""
        self.sleep_state.require_awake("generate")
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        sampling = [to_vllm_sampling(params, index) for index in range(len(prompts))]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.adapter)
        generations = [
            [to_generation(c, out.num_cached_tokens or 0) for c in sorted(out.outputs, key=lambda c: c.index)]
            for out in outputs
        ]
        if not engine_logprobs_are_exact(self.logprobs_mode, params):
            self._rescore(prompts, generations, params.temperature)
        return generations

    def _rescore(self, prompts: list[list[int]], generations: list[list[Generation]], temperature: float) -> None:
        if not self._warned_rescoring:
            log.warning(
                "vllm engine: sampling at temperature %g with top-k/top-p; vLLM reports no unfiltered tempered "
                "log-probs, so each response is re-scored from full-vocabulary prompt log-probs (exact, slower)",
                temperature,
            )
            self._warned_rescoring = True
        pairs = [
            (prompt, gen) for prompt, gens in zip(prompts, generations, strict=True) for gen in gens if gen.token_ids
        ]
        scores = self.score([(prompt, gen.token_ids) for prompt, gen in pairs], temperature)
        for (_, gen), logprobs in zip(pairs, scores, strict=True):
            gen.logprobs = logprobs

    # -- scoring ------------------------------------------------------------------------------------
    def response_logprobs(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        """log π_engine(response | prompt) token by token, under kuberl's temperature convention."""
        return self.score([(prompt, response)], temperature)[0]

    def score(self, pairs: list[tuple[list[int], list[int]]], temperature: float) -> list[list[float]]:
        """Each response's token log-probs given its prompt: one prefill per pair (prompt log-probs).

        At T in {0, 1} only the target token's log-prob comes back; otherwise the whole vocabulary's,
        rescaled with `tempered_logprobs` — O(R x V) Python objects, meant for probes and short batches.
        """
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self.sleep_state.require_awake("score")
        for prompt, _ in pairs:
            if not prompt:
                raise ValueError("response_logprobs: the prompt is empty; the first response token has no context")
        whole_vocabulary = temperature not in (0.0, 1.0)
        sampling = VLLMSamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=-1 if whole_vocabulary else 0, detokenize=False
        )
        requests = [TokensPrompt(prompt_token_ids=list(prompt) + list(response)) for prompt, response in pairs]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.adapter)
        scores = []
        for (prompt, response), out in zip(pairs, outputs, strict=True):
            steps = out.prompt_logprobs[len(prompt) :]  # step i: log-probs of the token at len(prompt) + i
            if not whole_vocabulary:
                scores.append([step[token].logprob for step, token in zip(steps, response, strict=True)])
                continue
            vocab = max(max(step) for step in steps) + 1
            full = torch.full((len(response), vocab), float("-inf"))  # (R, V) log_softmax(logits)
            for row, step in enumerate(steps):
                ids = torch.tensor(list(step))  # (V,)
                full[row, ids] = torch.tensor([entry.logprob for entry in step.values()])
            scores.append(tempered_logprobs(full, torch.tensor(response), temperature).tolist())
        return scores

    # -- weights --------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """Copy named full tensors (Hugging Face names) into the engine's model in place; returns bytes loaded.

        The iterator is consumed lazily, layer by layer: pass a generator (FSDPTrainer.full_tensors)
        and at most one layer's gathered tensors are alive at once. A tensor-parallel engine takes them
        a decoder layer per call instead, as lists pickled to each shard's process (see the module docstring).
        """
        counter = _ByteCounter(weights)
        # in-process: one lazy stream; split over worker processes: one pickled list per decoder layer
        loads: Iterable[Iterable[tuple[str, Tensor]]] = (
            layer_loads(counter) if self.worker_processes else [iter(counter)]
        )
        self.sleep_state.require_awake("load_weights", ("weights",))
        reload_logger = logging.getLogger(RELOAD_LOGGER)
        reload_logger.addFilter(self._reload_filter)
        try:
            with _quiet_reload_loggers() if self.partial_loads else contextlib.nullcontext():
                for load in loads:
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": load})
        finally:
            reload_logger.removeFilter(self._reload_filter)
        if self.device.type == "cpu":
            self.llm.collective_rpc(_refresh_shared_gemms)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        return counter.bytes

    def load_adapter(self, weights: Iterable[tuple[str, Tensor]]) -> int:
        """Load the LoRA adapter (saved-adapter names -> tensors) from memory in place; returns bytes loaded.

        From then on every generation and score uses it.
        """
        if self.adapter_config is None:
            raise RuntimeError("this vLLM engine was built without LoRA (spec.models.actor.lora, adapter sync)")
        from kuberl.runtime.engines.vllm_lora import adapter_request, serving_request

        request, size = adapter_request(weights, self.adapter_config)
        self.sleep_state.require_awake("load_adapter", ("weights",))
        self.llm.llm_engine.add_lora(request)
        self.adapter = serving_request()
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old adapter
        return size

    # -- memory ---------------------------------------------------------------------------------------
    def sleep(self, level: int) -> int:
        """On CUDA: drop the KV cache, and offload the weights to host memory (level 1) or drop them too (level 2,
        for an engine whose next sync reloads every weight); returns the device bytes that freed. Off CUDA
        nothing is released (vLLM sleeps only there), and the engine only records that it sleeps."""
        if not self.sleep_state.fall_asleep() or self.device.type != "cuda":
            return 0
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self.llm.sleep(level=level)
        return int(torch.cuda.mem_get_info(self.device)[0] - free_before)

    def wake_up(self, tags: Sequence[str] = SleepState.PARTS) -> None:
        """Take back the parts of `tags` that sleep (the weights before a sync writes them, the KV cache after)."""
        woken = self.sleep_state.wake(tags)
        if woken and self.device.type == "cuda":
            self.llm.wake_up(tags=woken)

    def shutdown(self) -> None:
        """Stops the engine. vLLM's teardown also destroys torch.distributed's default process group
        (in colocated mode the trainer's): call it last, after the trainer is done with the group.

        An engine split over processes on CPU also removes its communicator's shared memory (/dev/shm segments
        named after each shard process's VLLM_DIST_IDENT), which vLLM unlinks only when a shard's process exits
        normally: the mp executor's shards are terminated, and a colocated rank's actor is killed. A colocated
        group's ranks each remove the group's segments, whichever removes one first. The engine's IPC sockets go
        with their folder (`socket_folder`)."""
        split_on_cpu = self.shards > 1 and self.device.type == "cpu"
        idents = {ident for ident in self.llm.collective_rpc(_dist_ident_in_worker) if ident} if split_on_cpu else set()
        self.llm.llm_engine.engine_core.shutdown()
        for ident in idents:
            for segment in Path("/dev/shm").glob(f"{ident}-*cpushm*"):
                segment.unlink(missing_ok=True)
        shutil.rmtree(socket_folder(), ignore_errors=True)


def _dist_ident_in_worker(worker: Any) -> str:
    """In a shard's process: the name vLLM's CPU communicator gives its shared memory (cpu_worker.py sets it)."""
    return os.environ.get("VLLM_DIST_IDENT", "")


@contextlib.contextmanager
def _quiet_reload_loggers() -> Iterator[None]:
    """vLLM's reload warns about every layer a partial load leaves as it is; those are expected here."""
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload")
    level = reload_log.level
    reload_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        reload_log.setLevel(level)


class _ByteCounter:
    """Passes (name, tensor) pairs through, counting their bytes."""

    def __init__(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        self.weights = weights
        self.bytes = 0

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in self.weights:
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor
            del tensor  # not kept alive while the next one is gathered
