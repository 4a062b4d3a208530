"""models/loading.py: a critic loads without the dropout transformers puts before a token-classification
head (0.1 for Qwen2 and Llama configs): its update runs in train mode and its values for GAE in eval mode, which
must be one function."""

import torch

from kuberl.api import parse_rljob
from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.models.tiny import build_tiny_model
from kuberl.runtime.workers.model_worker import ModelWorker
from tests.unit.api.test_rules import spec_with


def test_the_model_worker_loads_a_critic_whose_train_mode_values_equal_its_eval_mode_values(tmp_path) -> None:
    worker = ModelWorker(rank=0, world_size=1)
    worker.job = parse_rljob(spec_with({"algorithm.advantageEstimator": "gae", "models.critic.path": "tiny://demo"}))
    worker.device = torch.device("cpu")
    location = ModelLocation(str(build_tiny_model("demo", tmp_path / "demo")), "spec.models.critic.path")
    trainer = worker._trainer(location, "float32", OptimizerSpec(lr=1e-3), 10, critic=True)
    dropouts = [module.p for module in trainer.model.modules() if isinstance(module, torch.nn.Dropout)]
    assert dropouts and set(dropouts) == {0.0}  # the head's dropout is there, and off
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = trainer.model.train()(input_ids=ids).logits
        scored = trainer.model.eval()(input_ids=ids).logits
    assert trained.shape == (2, 8, 1) and torch.equal(trained, scored)
