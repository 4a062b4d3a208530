"""spec.rollout.engineArgs against vLLM itself: the api's allow-list (kept without importing vLLM) names real
EngineArgs of the right type, and `llm_arguments` hands the engine what the job asked for."""

import dataclasses
import typing

import pytest

from kuberl.api import parse_rljob
from kuberl.api.engine_args import SET_BY_KUBERL, VLLM_ENGINE_ARGS
from kuberl.runtime.engines.vllm import llm_arguments
from tests.unit.api.test_rules import spec_with


def engine_arg_types() -> dict[str, object]:
    from vllm.engine.arg_utils import EngineArgs

    return {field.name: field.type for field in dataclasses.fields(EngineArgs)}


def accepts(annotation: object, kind: type) -> bool:
    """Whether a value of Python type `kind` fits `annotation` (a union, a Literal of strings, a plain type)."""
    if annotation is kind or (kind is int and annotation is float):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return all(isinstance(arg, kind) for arg in args)
    return any(accepts(arg, kind) for arg in args)


@pytest.mark.parametrize("name", sorted(VLLM_ENGINE_ARGS))
def test_every_allowed_engine_argument_is_one_of_vllms_of_the_type_the_api_checks(name):
    types = engine_arg_types()
    assert name in types, f"vLLM's EngineArgs has no {name}: drop it from kuberl.api.engine_args"
    assert accepts(types[name], VLLM_ENGINE_ARGS[name]), f"{name}: vLLM takes {types[name]}"


def test_every_argument_kuberl_sets_is_one_of_vllms():
    assert set(SET_BY_KUBERL) <= set(engine_arg_types())


def test_the_engine_runs_in_the_rollout_dtype_with_the_jobs_engine_arguments(tmp_path):
    args = {"max_num_seqs": 3, "enable_prefix_caching": False, "max_num_batched_tokens": 512}
    spec = parse_rljob(spec_with({"rollout.dtype": "bfloat16", "rollout.engineArgs": args})).spec
    arguments = llm_arguments(spec, str(tmp_path), cuda=False)
    assert arguments["dtype"] == "bfloat16" and spec.models.actor.dtype == "float32"
    assert {name: arguments[name] for name in args} == args
    assert arguments["model"] == str(tmp_path) and arguments["enforce_eager"] is True


def test_without_a_rollout_dtype_the_engine_runs_in_the_actors():
    spec = parse_rljob(spec_with({"models.actor": {"path": "/m", "dtype": "bfloat16"}})).spec
    assert llm_arguments(spec, "/m", cuda=True)["dtype"] == "bfloat16"
    spec = parse_rljob(spec_with({})).spec
    assert llm_arguments(spec, "/m", cuda=True)["dtype"] == "float32"
