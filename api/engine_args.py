"""`spec.rollout.engineArgs`: the vLLM engine arguments a job may pass through, checked without importing vLLM.

The api layer may not import vLLM, so the arguments it accepts are an allow-list here, each with its
type; a runtime test (tests/unit/runtime/engines/test_engine_args.py) holds every name to vLLM's `EngineArgs`.
verl passes `rollout.engine_kwargs.vllm` through unchecked, so a misspelled key there surfaces as a
vLLM error at start-up (or not at all); here it is refused at `kuberl validate`, with a did-you-mean.
"""

import difflib

#: vLLM EngineArgs a job may set (by vLLM's own names), with the Python type of their value.
VLLM_ENGINE_ARGS: dict[str, type] = {
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "enable_chunked_prefill": bool,
    "enable_prefix_caching": bool,
    "long_prefill_token_threshold": int,
    "block_size": int,
    "kv_cache_dtype": str,
    "quantization": str,
    "cpu_offload_gb": float,
    "disable_cascade_attn": bool,
    "disable_custom_all_reduce": bool,
    "disable_sliding_window": bool,
    "disable_log_stats": bool,
    "max_cudagraph_capture_size": int,
    "scheduling_policy": str,
}

#: EngineArgs kuberl sets itself, and what sets each: passing one through would fight that field.
SET_BY_KUBERL: dict[str, str] = {
    "model": "spec.models.actor.path",
    "tokenizer": "spec.models.actor.tokenizer",
    "dtype": "spec.rollout.dtype",
    "seed": "spec.training.seed",
    "max_model_len": "spec.data.maxPromptLength + spec.rollout.maxNewTokens",
    "tensor_parallel_size": "spec.rollout.tensorParallelSize",
    "distributed_executor_backend": "kuberl, from spec.rollout.tensorParallelSize (mp: a process per shard)",
    "gpu_memory_utilization": "spec.rollout.gpuMemoryUtilization",
    "kv_cache_memory_bytes": "spec.rollout.kvCacheBytes",
    "enable_lora": "spec.models.actor.lora",
    "max_lora_rank": "spec.models.actor.lora.rank",
    "max_loras": "spec.models.actor.lora",
    "logprobs_mode": "kuberl, from spec.rollout.temperature (its log-prob convention)",
    "max_logprobs": "kuberl (scoring reads the whole vocabulary's log-probs)",
    "generation_config": "kuberl (neutral defaults; sampling comes from spec.rollout)",
    "enforce_eager": "kuberl, from the device (eager on CPU, CUDA graphs on GPU)",
    "enable_sleep_mode": "kuberl, from the device (on GPU the engine sleeps while the trainer runs)",
}


def _type_name(kind: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]


def engine_arg_problem(name: str, value: object) -> str | None:
    """Why `name: value` cannot be passed to vLLM, or None when it can.

    >>> engine_arg_problem("max_num_seqs", 64) is None
    True
    >>> engine_arg_problem("max_num_batched_token", 8192)
    'unknown vLLM engine argument max_num_batched_token (did you mean max_num_batched_tokens?)'
    >>> engine_arg_problem("dtype", "bfloat16")
    'dtype is set by spec.rollout.dtype; set it there'
    """
    if name in SET_BY_KUBERL:
        return f"{name} is set by {SET_BY_KUBERL[name]}; set it there"
    kind = VLLM_ENGINE_ARGS.get(name)
    if kind is None:
        close = difflib.get_close_matches(name, list(VLLM_ENGINE_ARGS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else f"; allowed: {', '.join(VLLM_ENGINE_ARGS)}"
        return f"unknown vLLM engine argument {name}{hint}"
    fits = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float:
        fits = isinstance(value, int | float) and not isinstance(value, bool)
    if not fits:
        return f"{name} takes {_type_name(kind)}, found {value!r}"
    if kind in (int, float) and value < 0:  # type: ignore[operator]
        return f"{name} must not be negative, found {value!r}"
    return None
