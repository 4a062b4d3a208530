"""An offloaded update that runs out of device memory names the field that would make it fit
(models.<role>.offload.perLayer, .gradientsOnDevice), and only where that field would change anything."""

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
    worker.trainers[role] = SimpleNamespace(gathers_per_step=True, reduces_per_step=True)  # type: ignore[assignment]
    with pytest.raises(torch.OutOfMemoryError) as raised:
        getattr(worker, f"update_{role}")(None, None)
    message = str(raised.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 2.00 GiB")  # the original stays first
    assert f"models.{role}.offload.perLayer: true and gradientsOnDevice: true" in message
    assert "6 bytes a parameter" in message and "4 bytes a parameter" in message


def error_beside(role: str, gathers_per_step: bool, reduces_per_step: bool) -> str:
    """The message of an out-of-memory error raised in an update of a trainer with that offload layout."""
    trainer = SimpleNamespace(gathers_per_step=gathers_per_step, reduces_per_step=reduces_per_step)
    with pytest.raises(torch.OutOfMemoryError) as raised, model_worker.out_of_memory_names_the_offload(role, trainer):  # type: ignore[arg-type]
        out_of_memory()
    return str(raised.value)


def test_an_update_keeping_only_its_gradients_names_gradients_on_device() -> None:
    message = error_beside("critic", gathers_per_step=False, reduces_per_step=True)
    assert "models.critic.offload.gradientsOnDevice keeps" in message and "set it to false" in message
    assert "perLayer" not in message  # it already moves layer by layer


def test_an_update_that_moves_layer_by_layer_already_keeps_its_error() -> None:
    message = error_beside("actor", gathers_per_step=False, reduces_per_step=False)
    assert message == "CUDA out of memory. Tried to allocate 2.00 GiB"
