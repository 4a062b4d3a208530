"""rollout.tensorParallelSize in the vLLM engine's arguments and start-up checks (no engine is started)."""

import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from kuberl.api import parse_rljob
from kuberl.runtime.engines.vllm import (
    layer_loads,
    llm_arguments,
    remove_abandoned_socket_folders,
    socket_folder,
    tensor_parallel_problem,
    tensor_parallel_refusal,
    worker_environment,
)
from tests.unit.api.test_rules import spec_with

SEPARATE_CPU_POOL = {"rollout.placement": "separate", "resources.rollout": {"replicas": 1, "cpus": 4}}


def test_a_split_engine_runs_its_shards_in_worker_processes_of_vllms_mp_executor():
    spec = parse_rljob(spec_with({**SEPARATE_CPU_POOL, "rollout.tensorParallelSize": 2})).spec
    arguments = llm_arguments(spec, "/m", cuda=False)
    assert (arguments["tensor_parallel_size"], arguments["distributed_executor_backend"]) == (2, "mp")


def test_an_unsplit_engine_keeps_vllms_in_process_executor():
    arguments = llm_arguments(parse_rljob(spec_with({})).spec, "/m", cuda=False)
    assert "tensor_parallel_size" not in arguments and "distributed_executor_backend" not in arguments


def test_cpu_shards_share_the_replicas_threads_and_are_not_pinned_by_vllm():
    assert worker_environment(2, cuda=False, threads=4) == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "2",
    }
    assert worker_environment(4, cuda=False, threads=2)["OMP_NUM_THREADS"] == "1"
    assert worker_environment(2, cuda=True, threads=4) == {}  # vLLM places GPU workers itself
    assert worker_environment(1, cuda=False, threads=4) == {}


@pytest.mark.parametrize(
    ("heads", "kv_heads", "shards", "problem"),
    [
        (4, 2, 2, None),
        (32, 8, 4, None),
        (28, 4, 4, None),  # Qwen2.5-7B at 4 shards
        (16, 2, 4, None),  # 2 KV heads, each replicated on 2 shards
        (4, 2, 3, "4 attention heads, which 3 shards cannot split evenly"),
        (12, 3, 2, "3 key-value heads, which 2 shards can neither split nor replicate evenly"),
        (12, 2, 3, "2 key-value heads, which 3 shards can neither split nor replicate evenly"),
    ],
)
def test_a_split_must_divide_the_models_heads(heads, kv_heads, shards, problem):
    config = {"num_attention_heads": heads, "num_key_value_heads": kv_heads}
    found = tensor_parallel_problem(config, shards)
    assert found is None if problem is None else problem in found


def test_a_split_the_model_cannot_take_is_refused_naming_the_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    refusal = tensor_parallel_refusal(str(tmp_path), 3)
    assert refusal is not None and refusal.startswith("spec.rollout.tensorParallelSize 3: the model has 4 attention")
    assert tensor_parallel_refusal(str(tmp_path), 2) is None


def test_a_split_engines_sync_sends_each_decoder_layer_whole_in_one_load():
    names = [
        "model.embed_tokens.weight",
        *(f"model.layers.{i}.{part}.weight" for i in (0, 1) for part in ("self_attn.q_proj", "mlp.up_proj")),
        "model.norm.weight",
        "lm_head.weight",
    ]
    loads = [[name for name, _ in load] for load in layer_loads((name, torch.zeros(1)) for name in names)]
    assert loads == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"],
        ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight"],
        ["model.norm.weight"],
        ["lm_head.weight"],
    ]
    assert sum(loads, []) == names  # everything, in order


def test_a_layer_whose_tensors_come_apart_is_refused_rather_than_rebuilt_half_loaded():
    names = ["model.layers.0.a.weight", "model.layers.1.a.weight", "model.layers.0.b.weight"]
    with pytest.raises(ValueError, match="model.layers.0 come in two runs"):
        list(layer_loads((name, torch.zeros(1)) for name in names))


# -- the engine's IPC sockets -------------------------------------------------------------------------------
def bound_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def test_the_sockets_of_a_process_that_is_gone_are_removed_and_nothing_that_is_still_in_use(monkeypatch, tmp_path):
    """What a killed shard or actor left (its socket files, no listener) goes; the folder of a live process, or
    one where something still listens (a process of another PID namespace sharing the folder), stays."""
    assert len(str(socket_folder(4194304) / ("0" * 36))) < 107  # a socket's path under /tmp, largest PID: sun_path fits
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # exited and reaped
    abandoned, listening, alive = socket_folder(dead_pid), tmp_path / "kuberl-vllm-999999999", socket_folder()
    for folder in (abandoned, listening, alive):
        folder.mkdir()
    bound_socket(abandoned / "f8a1").close()  # closed without unlinking: the file stays, nobody listens
    with bound_socket(listening / "c3d2"), bound_socket(alive / "0b7e"):
        assert remove_abandoned_socket_folders() == [abandoned]
        assert not abandoned.exists() and listening.exists() and alive.exists()
