"""The gradient norm of gradients in host memory (an offloaded model's, a CPU trainer's): the step clips by it and
reports it, so it must be the norm, at any tensor size (engines/grad_norm.py)."""

import torch

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.engines.fsdp import FSDPTrainer
from kuberl.runtime.engines.grad_norm import gradient_norm

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
