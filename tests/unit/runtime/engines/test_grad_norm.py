"""The gradient norm of gradients in host memory (an offloaded model's, a CPU trainer's): the step clips by it and
reports it, so it must be the norm, at any tensor size (engines/grad_norm.py)."""

from typing import Any

import pytest
import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.grad_norm import gradient_norm, needs_clipping

#: elements in the large gradient: torch's own CPU norm of it is 0.1-0.2% low (pytorch#169237), the norm here
#: must be within 1e-6
LARGE = 32_000_000


def float64_norm(tensors: list[torch.Tensor]) -> float:
    return sum(float(tensor.double().square().sum()) for tensor in tensors) ** 0.5


def test_the_norm_of_a_large_host_gradient_is_its_float64_norm() -> None:
    grads = [torch.randn(LARGE, generator=torch.Generator().manual_seed(0)) * 1e-3, torch.randn(7, 3)]
    exact = float64_norm(grads)
    norm = gradient_norm(grads, torch.device("cpu"), world_size=1)
    assert norm.dtype == torch.float32 and norm.shape == ()
    assert abs(float(norm) - exact) / exact < 1e-6, (float(norm), exact)


def test_non_finite_gradients_give_a_non_finite_norm() -> None:
    """The step's skip test (`optimizer_step`) reads the norm: one inf or NaN anywhere must reach it."""
    for bad in (float("inf"), float("nan")):
        grad = torch.ones(300_000)
        grad[-1] = bad
        assert not torch.isfinite(gradient_norm([torch.ones(3), grad], torch.device("cpu"), world_size=1))


class OneLargeParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(LARGE))


def test_the_trainer_clips_by_and_reports_the_float64_norm() -> None:
    model = OneLargeParameter()
    trainer = FSDPTrainer(
        model, world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-3, grad_clip=1.0), total_steps=1
    )
    grad = torch.randn(LARGE, generator=torch.Generator().manual_seed(1)) * 1e-3
    exact = float64_norm([grad])
    model.weight.grad = grad.clone()
    clipped: list[torch.Tensor] = []
    assert trainer.optimizer is not None
    trainer.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: clipped.append(model.weight.grad.clone()))
    step = trainer.optimizer_step()
    assert abs(float(step["grad_norm"]) - exact) / exact < 1e-6
    assert step["skipped"] == 0.0
    # clipped to norm 1 by the same number: what AdamW then read
    assert abs(float64_norm(clipped) - 1.0) < 1e-5


def test_a_step_below_the_clip_leaves_host_gradients_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scaling by 1 would be a pass over every host gradient for nothing (0.11 s for a 0.5B model here)."""
    scaled: list[float] = []
    clip_grads_with_norm = torch.nn.utils.clip_grads_with_norm_

    def recording(parameters: Any, max_norm: float, total_norm: torch.Tensor, foreach: Any = None) -> None:
        scaled.append(max_norm)
        clip_grads_with_norm(parameters, max_norm, total_norm, foreach)

    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", recording)
    for clip, expected in ((100.0, []), (1.0, [1.0]), (None, [])):
        model = torch.nn.Linear(4, 4)
        trainer = FSDPTrainer(
            model, world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-3, grad_clip=clip), total_steps=1
        )
        model.weight.grad, model.bias.grad = torch.full((4, 4), 1.0), torch.zeros(4)  # norm 4
        scaled.clear()
        step = trainer.optimizer_step()
        assert scaled == expected, clip
        assert float(step["grad_norm"]) == 4.0


def test_a_norm_on_another_device_is_clipped_by_without_being_read() -> None:
    """A GPU's norm: deciding whether to clip would make the host wait for the device, so it always clips (the
    scale is 1 below the clip). On the meta device, the CPU tests' stand-in for a GPU, any read raises."""
    assert needs_clipping(torch.tensor(0.5, device="meta"), 1.0)
    with pytest.raises(RuntimeError):
        float(torch.tensor(0.5, device="meta"))  # what reading it would do
