"""The vLLM rollout engine (real vLLM, CPU build) against a plain Hugging Face forward of the same weights.

The hybrid engine's core claim: after the trainer's weights stream into the engine in place, the
engine's log-probabilities are the trainer's — log_softmax(logits / T) of each token, within
1e-4 in fp32. The weights loaded here are the tiny demo model's, perturbed (scaled and noised),
so a load that silently kept the old weights (a stale packed GEMM copy, a stale prefix cache,
an untouched tied LM head) shows up as a difference of 0.05 or more.

Two engines share the module: the tied-embedding demo model sampling at T = 1 (vLLM's raw
log-probs), and an untied copy sampling at T = 0.7 (processed log-probs).
"""

import copy
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kuberl.api import parse_rljob
from kuberl.runtime.engines.base import SamplingParams
from kuberl.runtime.models.resolve import ModelLocation
from kuberl.runtime.models.tiny import build_tiny_model
from kuberl.runtime.workers.rollout_worker import (
    RolloutWorker,
    StaleWeightsError,
    put_weight_buckets,
    weight_buckets,
)

pytestmark = pytest.mark.integration

#: The last prompt spans more than one KV block (128 tokens on CPU), so the prefix cache holds it.
PROMPTS = [[5, 17, 33, 9], [101, 7], [(7 * i) % 509 + 3 for i in range(150)]]
TOLERANCE = 1e-4


def manifest(model_dir: Path, temperature: float, **rollout: object) -> dict:
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "vllm-engine-test"},
        "spec": {
            "models": {"actor": {"path": str(model_dir)}},
            "data": {"train": "/data/train.jsonl", "maxPromptLength": 160},
            "reward": {"function": "math_exact"},
            "rollout": {
                "engine": "vllm",
                "temperature": temperature,
                "maxNewTokens": 12,
                "kvCacheBytes": 16 << 20,
                **rollout,
            },
        },
    }


def hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy with every parameter scaled by 1.3 and noised by half its own spread."""
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for _, weight in model.named_parameters():
        spread = weight.std() if weight.numel() > 1 else weight.abs()
        weight.mul_(1.3).add_(torch.randn(weight.shape, generator=generator) * 0.5 * spread)
    return model


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """The trainer's convention: log_softmax(logits / T) of each response token (T = 0 scores at 1)."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]  # (R, V)
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)  # (R,)


def vllm_engine(model_dir: Path, temperature: float, **rollout: object):
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    spec = parse_rljob(manifest(model_dir, temperature, **rollout)).spec
    return VLLMRolloutEngine.create(spec, str(model_dir), torch.device("cpu"))


# -- fixtures: built once per module (a vLLM engine costs seconds) ---------------------------------------
@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("demo", tmp_path_factory.mktemp("tied"))


@pytest.fixture(scope="module")
def untied_dir(tied_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with an LM head of its own (a noised copy of the embedding)."""
    from transformers import AutoTokenizer

    model = hf_model(tied_dir)
    model.config.tie_word_embeddings = False
    embedding = model.get_input_embeddings().weight.detach()
    model.lm_head.weight = torch.nn.Parameter(embedding.clone() + 0.01 * torch.randn_like(embedding))
    target = tmp_path_factory.mktemp("untied")
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(tied_dir).save_pretrained(target)
    return target


class Loaded:
    """An engine after a load of perturbed weights, beside the HF model holding those same weights."""

    def __init__(self, model_dir: Path, temperature: float, seed: int) -> None:
        self.original = hf_model(model_dir)
        self.engine = vllm_engine(model_dir, temperature)
        # Fill the prefix cache with the original weights' KV blocks: a load must invalidate them.
        self.engine.generate(PROMPTS, SamplingParams(n=2, temperature=temperature, max_new_tokens=4))
        self.reference = perturbed(self.original, seed)
        self.bytes = self.engine.load_weights((n, w.detach()) for n, w in self.reference.named_parameters())


@pytest.fixture(scope="module")
def tied(tied_dir: Path) -> Loaded:
    return Loaded(tied_dir, temperature=1.0, seed=1)


@pytest.fixture(scope="module")
def untied(untied_dir: Path) -> Loaded:
    return Loaded(untied_dir, temperature=0.7, seed=2)


# -- generation ---------------------------------------------------------------------------------------
def test_generate_returns_n_responses_per_prompt_each_with_a_logprob_per_token(tied: Loaded) -> None:
    out = tied.engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=12, seed=4))
    assert [len(generations) for generations in out] == [3, 3, 3]
    for generation in (g for generations in out for g in generations):
        assert 1 <= len(generation.token_ids) <= 12
        assert len(generation.logprobs) == len(generation.token_ids)
        if len(generation.token_ids) < 12:  # only a stop token ends a response early
            assert generation.finish_reason == "stop"


def test_same_seed_and_prompts_give_the_same_responses(tied: Loaded) -> None:
    params = SamplingParams(n=2, max_new_tokens=12, seed=11)
    first = [[g.token_ids for g in gens] for gens in tied.engine.generate(PROMPTS, params)]
    second = [[g.token_ids for g in gens] for gens in tied.engine.generate(PROMPTS, params)]
    assert first == second


def test_samples_of_one_prompt_and_of_another_seed_differ(tied: Loaded) -> None:
    first = tied.engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=12, seed=11))[0]
    other_seed = tied.engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=12, seed=12))[0]
    assert first[0].token_ids != first[1].token_ids
    assert first[0].token_ids != other_seed[0].token_ids


def test_stop_token_ends_a_response_and_is_kept(tied: Loaded) -> None:
    free = tied.engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, seed=5))[0][0]
    stop = free.token_ids[3]  # the 4th token sampled without a stop: with it as a stop token, generation ends there
    cut = tied.engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, seed=5, stop_token_ids=(stop,)))[0][0]
    assert cut.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert cut.finish_reason == "stop"


def test_a_prompt_with_its_own_seed_samples_the_same_whatever_shares_its_call(tied: Loaded) -> None:
    """Multi-turn episodes are batched as they become ready: a row's seed and budget are its own."""
    params = SamplingParams(max_new_tokens=12, row_seeds=(7, 8, 9), row_max_new_tokens=(12, 5, 12))
    together = tied.engine.generate(PROMPTS, params)
    alone = tied.engine.generate(
        PROMPTS[1:2], SamplingParams(max_new_tokens=12, row_seeds=(8,), row_max_new_tokens=(5,))
    )
    assert together[1][0].token_ids == alone[0][0].token_ids
    assert len(together[1][0].token_ids) <= 5 and len(together[0][0].token_ids) <= 12


def test_the_next_turn_of_an_episode_reads_its_earlier_turns_from_the_prefix_cache(tied: Loaded) -> None:
    """An episode's second message extends the context of its first: vLLM serves the shared blocks from cache."""
    prompt = [(11 * i) % 499 + 5 for i in range(150)]  # no other test's: more than one 128-token KV block
    first = tied.engine.generate([prompt], SamplingParams(max_new_tokens=8, row_seeds=(1,)))[0][0]
    context = prompt + first.token_ids + [11, 12, 13]  # the episode so far: prompt, message, observation
    second = tied.engine.generate([context], SamplingParams(max_new_tokens=8, row_seeds=(2,)))[0][0]
    assert first.cached_tokens == 0 and second.cached_tokens >= 128


# -- weights in, the trainer's log-probs out -------------------------------------------------------------
def test_load_weights_returns_the_bytes_of_every_tensor_streamed(tied: Loaded) -> None:
    # fp32: 4 bytes per parameter; named_parameters yields the tied embedding once
    assert tied.bytes == 4 * sum(w.numel() for w in tied.reference.parameters())


def test_load_weights_consumes_the_stream_without_holding_earlier_tensors(tied: Loaded) -> None:
    alive: list[weakref.ref] = []
    most_alive = 0

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal most_alive
        for name, weight in tied.reference.named_parameters():
            most_alive = max(most_alive, sum(ref() is not None for ref in alive))
            tensor = weight.detach().clone()
            alive.append(weakref.ref(tensor))
            yield name, tensor
            del tensor

    tied.engine.load_weights(stream())
    # vLLM buffers a fused layer's inputs until the layer is complete (q and k wait for v, then qkv_proj is
    # rebuilt): at most one fused layer's inputs (3 of the model's 37 tensors) are alive, never a copy
    assert most_alive <= 3


@pytest.mark.parametrize(
    ("which", "temperature"),
    [("tied", 1.0), ("tied", 0.7), ("untied", 0.7), ("untied", 0.0)],
    ids=["tied-T1", "tied-T0.7-full-vocabulary", "untied-T0.7-full-vocabulary", "untied-greedy"],
)
def test_response_logprobs_match_an_hf_forward_of_the_loaded_weights(
    which: str, temperature: float, request: pytest.FixtureRequest
) -> None:
    loaded: Loaded = request.getfixturevalue(which)
    response = [40, 41, 300, 2, 99, 7]
    for prompt in PROMPTS:
        expected = hf_logprobs(loaded.reference, prompt, response, temperature)  # (R,)
        before = hf_logprobs(loaded.original, prompt, response, temperature)  # (R,)
        assert (expected - before).abs().max() > 0.05  # the perturbation is visible at this tolerance
        engine = torch.tensor(loaded.engine.response_logprobs(prompt, response, temperature))
        torch.testing.assert_close(engine, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    ("which", "params"),
    [
        ("tied", SamplingParams(temperature=1.0, top_k=50, max_new_tokens=10, n=2, seed=3)),
        ("untied", SamplingParams(temperature=0.7, max_new_tokens=10, n=2, seed=3)),
        ("untied", SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10, n=2, seed=3)),
        ("tied", SamplingParams(temperature=0.0, max_new_tokens=10)),
    ],
    ids=["raw-T1-top-k", "processed-T0.7", "rescored-T0.7-top-p", "greedy"],
)
def test_generation_logprobs_match_an_hf_forward_of_the_sampled_tokens(
    which: str, params: SamplingParams, request: pytest.FixtureRequest
) -> None:
    loaded: Loaded = request.getfixturevalue(which)
    out = loaded.engine.generate(PROMPTS, params)
    for prompt, generations in zip(PROMPTS, out, strict=True):
        for generation in generations:
            expected = hf_logprobs(loaded.reference, prompt, generation.token_ids, params.temperature)  # (R,)
            torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=TOLERANCE, rtol=0)


# -- the separate-mode rollout worker -------------------------------------------------------------------
def test_weight_buckets_hold_at_most_the_bucket_size_and_keep_the_order() -> None:
    weights = [("a", torch.zeros(1)), ("b", torch.zeros(1)), ("c", torch.zeros(1)), ("d", torch.zeros(4))]
    # 4 bytes each, then 16 bytes; buckets of 8: a+b fit, c would overflow with d, d goes alone
    buckets = [[name for name, _ in bucket] for bucket in weight_buckets(weights, bucket_bytes=8)]
    assert buckets == [["a", "b"], ["c"], ["d"]]


@pytest.fixture(scope="module")
def worker(tied_dir: Path) -> RolloutWorker:
    worker = RolloutWorker(rank=0, world_size=1)
    model = ModelLocation(str(tied_dir), "spec.models.actor.path")
    worker.setup(manifest(tied_dir, temperature=1.0), model, model)
    return worker


def test_rollout_worker_refuses_to_generate_with_another_weight_version(worker: RolloutWorker) -> None:
    params = SamplingParams(max_new_tokens=4)
    assert len(worker.generate(PROMPTS[:1], params, version=worker.weight_version)) == 1
    with pytest.raises(StaleWeightsError, match="weight version 9 but it holds weight version"):
        worker.generate(PROMPTS[:1], params, version=9)


def test_rollout_worker_loads_buckets_from_the_object_store(worker: RolloutWorker, tied: Loaded, ray_session) -> None:
    version = (worker.weight_version or 0) + 1
    refs = put_weight_buckets(((n, w.detach()) for n, w in tied.reference.named_parameters()), bucket_mb=1)
    assert len(refs) > 1  # ~4 MB of weights in 1 MB buckets
    worker.load_weights_from(refs, version)
    response = [40, 41, 300, 2]
    engine = torch.tensor(worker.response_logprobs(PROMPTS[0], response, 1.0, version=version))
    expected = hf_logprobs(tied.reference, PROMPTS[0], response, 1.0)
    torch.testing.assert_close(engine, expected, atol=TOLERANCE, rtol=0)


def test_engine_starts_in_a_process_that_imported_flask(tied_dir: Path):
    # flask's proxies raise on hasattr() outside a request; vLLM's CPU kernel scan at start-up tripped on them
    import flask  # noqa: F401  - installed with moto[server]

    engine = vllm_engine(tied_dir, 1.0)
    generations = engine.generate(PROMPTS[:1], SamplingParams(n=1, temperature=1.0, max_new_tokens=3))
    assert len(generations) == 1 and generations[0][0].token_ids
    engine.shutdown()


def test_a_bf16_rollout_of_an_fp32_actor_runs_with_the_jobs_engine_arguments(tied_dir: Path, tied: Loaded):
    """rollout.dtype bfloat16 beside a float32 actor (verl's default pairing), and rollout.engineArgs, reach vLLM;
    the trainer's float32 weights load into the bfloat16 engine, cast on the way in."""
    engine = vllm_engine(tied_dir, 1.0, dtype="bfloat16", engineArgs={"max_num_seqs": 3, "max_num_batched_tokens": 384})
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.dtype == torch.bfloat16
    assert (config.scheduler_config.max_num_seqs, config.scheduler_config.max_num_batched_tokens) == (3, 384)
    engine.load_weights((n, w.detach()) for n, w in tied.reference.named_parameters())  # float32 tensors
    response = [40, 41, 300, 2, 99, 7]
    scored = torch.tensor(engine.response_logprobs(PROMPTS[0], response, 1.0))
    expected = hf_logprobs(tied.reference, PROMPTS[0], response, 1.0)  # the same weights, in float32
    before = hf_logprobs(tied.original, PROMPTS[0], response, 1.0)
    assert (scored - expected).abs().max() < 0.1 < (expected - before).abs().max()  # bf16-close, and loaded
    assert (scored - expected).abs().max() > 0  # not the float32 numbers: the engine did run in bfloat16
    engine.shutdown()


def test_the_hf_engine_also_holds_its_model_in_the_rollout_dtype(tied_dir: Path):
    from transformers import AutoTokenizer

    from kuberl.runtime.engines import build_rollout_engine

    spec = parse_rljob(manifest(tied_dir, 1.0, engine="hf", dtype="bfloat16")).spec
    engine = build_rollout_engine(spec, str(tied_dir), AutoTokenizer.from_pretrained(tied_dir), torch.device("cpu"))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
