"""The GPU path (marker `gpu`): vLLM on CUDA against the trainer after a sync, sleep/wake, resume on GPU.

Skipped, with the reason, where no CUDA device exists (every developer machine and CI here): run them on
a GPU machine with `pytest -m gpu`. Each uses the tiny demo model, so each takes seconds of GPU time.

Tolerances:
- Engine vs trainer log-probs after a sync, bf16 weights on both sides: 1e-3 on the mean absolute
  difference over the probe's tokens, 2e-2 on the largest. bf16 keeps 8 significant bits (relative
  rounding 2^-9 ~ 2e-3 per stored value); both sides hold bit-identical bf16 weights after the sync and
  accumulate matmuls in fp32, so what differs is the order of accumulation (vLLM's fused qkv/gate-up
  GEMMs and its attention kernel against transformers' eager/SDPA path) and where activations are
  rounded to bf16. Each rounding moves a logit by ~2e-3 x |logit| (~1e-2 for the tiny model's logits,
  |logit| < 5), and a log-prob by about the difference of its token's logit error and the
  probability-weighted mean error; these largely cancel over tokens (mean ~1e-4..1e-3), while a single
  token can catch several roundings in the same direction (hence the 2e-2 ceiling on the maximum).
- The fp32 probe (`rollout.verifySync` with fp32 weights, bf16 training compute) keeps CPU's 1e-4:
  fp32 weights and fp32 scoring on both sides differ only by accumulation order (TF32 off).
These bounds are reasoned, not yet measured: no GPU was lent when they were written.
"""

import shutil

import pytest
import torch

from kuberl.runtime.driver import run_job
from tests.integration.runtime.jobs import demo_base_dir, demo_job

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)"),
]
GPU_JOB = {
    "resources.actor": {"replicas": 1, "cpus": 2, "gpus": 1},
    "rollout.engine": "vllm",
    "rollout.gpuMemoryUtilization": 0.3,
    "rollout.kvCacheBytes": None,
}
MEAN_TOLERANCE, MAX_TOLERANCE = 1e-3, 2e-2


@pytest.fixture
def cuda_demo(tmp_path):
    from kuberl.runtime.models.resolve import resolve_model_path

    return resolve_model_path("tiny://demo", tmp_path / "cache", "spec.models.actor.path")


def test_engine_reproduces_the_trainer_after_a_sync_in_bf16(tmp_path, cuda_demo) -> None:
    from transformers import AutoModelForCausalLM

    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    spec = demo_job(**GPU_JOB, **{"models.actor.dtype": "bfloat16"}).spec
    cuda = torch.device("cuda", 0)
    engine = VLLMRolloutEngine.create(spec, str(cuda_demo), cuda)
    try:
        trainer = AutoModelForCausalLM.from_pretrained(cuda_demo, dtype=torch.bfloat16).to(cuda)
        with torch.no_grad():
            for param in trainer.parameters():  # a policy the engine has not seen: the sync must carry it
                param.add_(torch.randn_like(param) * 0.02)
        engine.load_weights((name, p.detach()) for name, p in trainer.named_parameters())
        prompt, response = list(range(20, 36)), list(range(40, 72))
        engine_lp = torch.tensor(engine.response_logprobs(prompt, response, 1.0))
        ids = torch.tensor([prompt + response], device=cuda)
        with torch.no_grad():
            logits = trainer(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (R, V)
        trainer_lp = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1).cpu()
        diff = (engine_lp - trainer_lp).abs()
        assert diff.mean() <= MEAN_TOLERANCE and diff.max() <= MAX_TOLERANCE, diff
    finally:
        engine.shutdown()


def test_sleep_frees_the_kv_cache_and_wake_up_generates_again(cuda_demo) -> None:
    from kuberl.runtime.engines.base import SamplingParams
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    spec = demo_job(**GPU_JOB).spec
    engine = VLLMRolloutEngine.create(spec, str(cuda_demo), torch.device("cuda", 0))
    try:
        params = SamplingParams(max_new_tokens=8, seed=3)
        before_tokens = engine.generate([[20, 21, 22]], params)[0][0].token_ids
        free_before = torch.cuda.mem_get_info()[0]
        engine.sleep()
        freed = torch.cuda.mem_get_info()[0] - free_before
        total = torch.cuda.mem_get_info()[1]
        # gpuMemoryUtilization 0.3 reserves ~30% of the GPU, nearly all of it KV cache for a 1M model
        assert freed > 0.2 * total, f"sleep freed {freed / 2**30:.2f} GiB of {total / 2**30:.0f}"
        engine.wake_up()
        assert engine.generate([[20, 21, 22]], params)[0][0].token_ids == before_tokens
    finally:
        engine.shutdown()


def test_a_run_resumed_on_gpu_is_bit_identical(ray_session, tmp_path) -> None:
    def job():
        return demo_job(
            **GPU_JOB,
            **{"training.totalSteps": 4, "checkpoint.intervalSteps": 2, "models.actor.optim.schedule": "cosine"},
        )

    whole = run_job(job(), tmp_path / "whole", demo_base_dir(), progress=False)
    resumed_dir = tmp_path / "resumed"
    (resumed_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-000002", resumed_dir / "checkpoints" / "step-000002")
    resumed = run_job(job(), resumed_dir, demo_base_dir(), progress=False)
    for key in ("actor/loss", "actor/grad_norm", "reward/mean"):
        assert [r[key] for r in resumed.history] == [r[key] for r in whole.history[2:]], key
    model = "model.safetensors"
    assert (resumed_dir / "model" / model).read_bytes() == (tmp_path / "whole" / "model" / model).read_bytes()
