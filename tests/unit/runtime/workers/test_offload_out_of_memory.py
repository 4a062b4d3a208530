"""An offloaded update that runs out of device memory names the field that would make it fit
(models.<role>.offload.perLayer), and only where that field would change anything."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kuberl.runtime.workers import model_worker
from kuberl.runtime.workers.model_worker import ModelWorker


def out_of_memory(*_: Any) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_an_update_gathered_for_the_step_that_runs_out_of_memory_names_per_layer(role: str, monkeypatch) -> None:
    monkeypatch.setattr(model_worker, "update_policy", out_of_memory)
    monkeypatch.setattr(model_worker, "update_critic", out_of_memory)
    worker = ModelWorker(rank=0, world_size=1)
    worker.trainers[role] = SimpleNamespace(gathers_per_step=True)  # type: ignore[assignment]
    with pytest.raises(torch.OutOfMemoryError) as raised:
        getattr(worker, f"update_{role}")(None, None)
    message = str(raised.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 2.00 GiB")  # the original stays first
    assert f"models.{role}.offload.perLayer: true" in message


def test_an_update_that_moves_layer_by_layer_already_keeps_its_error() -> None:
    worker = ModelWorker(rank=0, world_size=1)
    worker.trainers["actor"] = SimpleNamespace(gathers_per_step=False)  # type: ignore[assignment]
    with (
        pytest.raises(torch.OutOfMemoryError) as raised,
        model_worker.out_of_memory_names_the_offload("actor", worker.trainers["actor"]),
    ):
        out_of_memory()
    assert "perLayer" not in str(raised.value)
