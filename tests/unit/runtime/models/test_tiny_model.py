"""tiny:// models: complete Hugging Face folders, built deterministically, resolved into a cache."""

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, LlamaForCausalLM

from kuberl.runtime.models import resolve as resolve_module
from kuberl.runtime.models.pretrain import PretrainingSpec, corpus_batches, learning_rate, pretrain, token_batch
from kuberl.runtime.models.resolve import (
    ModelNotFoundError,
    check_model_location,
    resolve_model_metadata,
    resolve_model_path,
    tiny_model_dir,
)
from kuberl.runtime.models.tiny import TINY_MODELS, build_tiny_model, llama_config
from kuberl.runtime.rewards.builtin import tiny_task

FIELD = "spec.models.actor.path"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("demo", tmp_path_factory.mktemp("tiny") / "demo")


@pytest.fixture(scope="module")
def tokenizer(demo_dir: Path):
    return AutoTokenizer.from_pretrained(demo_dir)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_demo_folder_holds_a_complete_hugging_face_model(demo_dir: Path) -> None:
    names = {path.name for path in demo_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names


def test_tokenizer_round_trips_text_exactly(tokenizer) -> None:
    text = "count: 3 4 5\nThe answer is <answer>12</answer>  ok?"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_special_tokens_are_eos_pad_and_chatml(tokenizer) -> None:
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]


def test_numbers_0_to_99_after_a_space_are_one_token_each(tokenizer) -> None:
    multi_token = [n for n in range(100) if len(tokenizer(f" {n}")["input_ids"]) != 1]
    assert multi_token == []


def test_chat_template_renders_chatml_with_a_generation_prompt(tokenizer) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_demo_model_loads_with_about_a_million_tied_parameters(demo_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(demo_dir)
    parameters = sum(p.numel() for p in model.parameters())  # tied: the LM head is the embedding
    assert 0.8e6 < parameters < 1.5e6
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM CPU attention minimum


def test_demo_model_generates_after_a_prompt(demo_dir: Path, tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(demo_dir)
    inputs = tokenizer(["count: 3 4 5"], return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert output.shape[1] <= inputs["input_ids"].shape[1] + 4


def test_small_model_has_about_25_million_parameters(tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model("small", tmp_path / "small"))
    assert 20e6 < sum(p.numel() for p in model.parameters()) < 30e6


def test_reward_demo_is_a_one_label_classifier_with_the_demo_tokenizer(tmp_path: Path, demo_dir: Path) -> None:
    folder = build_tiny_model("reward-demo", tmp_path / "reward")
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.num_labels == 1
    assert model.config.pad_token_id == 0
    assert (folder / "tokenizer.json").read_bytes() == (demo_dir / "tokenizer.json").read_bytes()


def test_two_builds_are_byte_identical(tmp_path: Path, demo_dir: Path) -> None:
    again = build_tiny_model("demo", tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert sha256(again / name) == sha256(demo_dir / name), name


def test_a_build_on_a_trainer_rank_other_than_0_is_whole(tmp_path: Path, demo_dir: Path, monkeypatch) -> None:
    # Rank 1 of an initialised process group, as a trainer on a pod of its own builds its copy: transformers'
    # save_pretrained writes nothing but the tokenizer there unless told this model is the builder's own.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *args, **kwargs: 1)
    folder = build_tiny_model("demo", tmp_path / "rank-1")
    for name in ("model.safetensors", "config.json"):
        assert sha256(folder / name) == sha256(demo_dir / name), name


def test_different_names_get_different_weights(tmp_path: Path, demo_dir: Path) -> None:
    reward = build_tiny_model("reward-demo", tmp_path / "reward")
    assert sha256(reward / "model.safetensors") != sha256(demo_dir / "model.safetensors")


def test_a_build_leaves_the_global_torch_rng_as_it_was(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model("demo", tmp_path / "demo")
    torch.testing.assert_close(torch.rand(3), expected)


# ----------------------------------------------------------------------------- tiny://counter (pretrained)
#: The demo's prompts: count: a a+1 a+2 for a in 0..15 (examples/data/tiny-task.jsonl).
DEMO_SAMPLES = [{"prompt": f"count: {a} {a + 1} {a + 2}", "answer": f"{a + 3} {a + 4} {a + 5}"} for a in range(16)]


@pytest.fixture(scope="module")
def counter_dir() -> Path:
    """tiny://counter from the user's cache, as `kuberl run` resolves it (~20 s to build once per machine)."""
    from kuberl.runtime.models.resolve import default_cache_dir

    return resolve_model_path("tiny://counter", default_cache_dir(), FIELD)


def sample_demo(folder: Path, do_sample: bool) -> tuple[list[str], list[list[int]]]:
    """Responses to the demo's prompts (8 samples each, or 1 greedy), decoded, and their token ids."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    repeat = 8 if do_sample else 1
    inputs = tokenizer([s["prompt"] for s in DEMO_SAMPLES for _ in range(repeat)], return_tensors="pt")  # (N, 5)
    torch.manual_seed(0)
    output = model.generate(**inputs, max_new_tokens=12, do_sample=do_sample)  # (N, 5 + <=12)
    responses = output[:, inputs["input_ids"].shape[1] :].tolist()
    return tokenizer.batch_decode(responses, skip_special_tokens=True), responses


def test_counter_continues_every_demo_prompt_with_the_next_numbers(counter_dir: Path) -> None:
    texts, _ = sample_demo(counter_dir, do_sample=False)
    continued = [text.split()[:3] == sample["answer"].split() for text, sample in zip(texts, DEMO_SAMPLES, strict=True)]
    assert sum(continued) >= 14, list(zip(texts, continued, strict=True))


def test_counter_starts_the_demo_with_room_to_learn(counter_dir: Path) -> None:
    # Measured: a mean reward of ~0.45, ~7 tokens per response, ~85% ending with the end token.
    # GRPO needs both: rewards that differ within a group (a gradient) and room up to 1.
    texts, responses = sample_demo(counter_dir, do_sample=True)
    scores = [tiny_task(text, DEMO_SAMPLES[i // 8])[0] for i, text in enumerate(texts)]
    assert 0.25 < sum(scores) / len(scores) < 0.75
    words = [len(text.split()) for text in texts]
    assert sum(words) / len(words) > 4.0  # it counts on past the three numbers the task wants
    ended = [0 in ids for ids in responses]  # <|endoftext|>: it learned that a text ends
    assert sum(ended) / len(ended) > 0.5


def test_pretraining_repeats_exactly_on_one_machine(tokenizer) -> None:
    spec = PretrainingSpec(corpus="counting", steps=3, batch_size=4, warmup_steps=1)
    trained = []
    for _ in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(7)
            model = LlamaForCausalLM(llama_config(TINY_MODELS["demo"], tokenizer))
            loss = pretrain(model, tokenizer, spec, seed=7)
        trained.append((loss, model.state_dict()))
    assert trained[0][0] == trained[1][0]
    for name, tensor in trained[0][1].items():
        assert torch.equal(tensor, trained[1][1][name]), name


def test_pretraining_schedule_warms_up_then_decays_to_zero() -> None:
    spec = PretrainingSpec(corpus="counting", steps=100, lr=1e-3, warmup_steps=10)
    assert learning_rate(spec, 0) == pytest.approx(1e-4)
    assert learning_rate(spec, 9) == pytest.approx(1e-3)
    assert learning_rate(spec, 55) == pytest.approx(5e-4)
    assert learning_rate(spec, 100) == pytest.approx(0.0, abs=1e-12)


def test_a_pretraining_batch_labels_every_token_and_the_end_but_no_padding(tokenizer) -> None:
    input_ids, labels = token_batch(["count: 3 4 5", "count: 3 4 5 6 7"], tokenizer)  # (2, 8)
    eos = tokenizer.eos_token_id
    assert input_ids.shape == labels.shape == (2, 8)  # "count", ":", " 3" .. " 7", <eos>
    assert labels[1].tolist() == input_ids[1].tolist() and labels[1, -1] == eos
    assert labels[0, -2:].tolist() == [-100, -100] and labels[0, 5] == eos


def test_pretraining_documents_repeat_for_a_seed_and_stay_below_100() -> None:
    spec = PretrainingSpec(corpus="counting", steps=50)
    batches = corpus_batches(spec, seed=3)
    assert batches == corpus_batches(spec, seed=3) != corpus_batches(spec, seed=4)
    for text in (text for batch in batches for text in batch):
        numbers = [int(word) for word in text.removeprefix("count: ").split()]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))) and numbers[-1] <= 99
        assert len(numbers) >= 4 or numbers[-1] == 99


# ----------------------------------------------------------------------------- resolve_model_path


def test_tiny_uri_is_built_once_into_the_cache(tmp_path: Path) -> None:
    folder = resolve_model_path("tiny://demo", tmp_path, FIELD)
    assert folder == tiny_model_dir("demo", tmp_path)
    assert folder.parent == tmp_path / "tiny" and folder.name.startswith("demo-")
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path("tiny://demo", tmp_path, FIELD) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == written
    assert folders_in(folder.parent) == [folder.name]  # no staging folder left behind


def test_a_concurrent_builder_that_finished_first_wins(tmp_path: Path, demo_dir: Path) -> None:
    target = tmp_path / "tiny" / "demo-x"

    def fill_while_another_worker_finishes(staging: Path) -> None:
        build_tiny_model("demo", staging)
        build_tiny_model("demo", target)  # the other worker's rename lands first
        (target / "winner").write_text("")

    assert resolve_module._materialise(target, fill_while_another_worker_finishes) == target
    assert (target / "winner").exists()
    assert folders_in(target.parent) == ["demo-x"]


#: One worker process: counts its builds of tiny://demo in a file (a build that takes a second, so that two
#: at once overlap), waits for the go file, resolves tiny://demo into the cache and prints the folder.
RESOLVING_WORKER = """
import sys, time
from pathlib import Path
from kuberl.runtime.models import resolve, tiny

cache, builds, ready, go = (Path(arg) for arg in sys.argv[1:5])
build = tiny.build_tiny_model  # resolve imports it when it resolves a tiny:// model

def counted_build(name, directory):
    with builds.open("a") as log:
        log.write(name + "\\n")
    time.sleep(1.0)
    return build(name, directory)

tiny.build_tiny_model = counted_build
ready.touch()
while not go.exists():
    time.sleep(0.01)
print(resolve.resolve_model_path("tiny://demo", cache, "spec.models.actor.path"))
"""


def test_two_workers_resolving_one_model_at_once_build_it_once(tmp_path: Path, demo_dir: Path) -> None:
    cache, builds, go = tmp_path / "cache", tmp_path / "builds", tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", RESOLVING_WORKER, str(cache), str(builds), str(tmp_path / f"ready-{n}"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):  # both imported: start them together
        assert all(worker.poll() is None for worker in workers), [worker.communicate() for worker in workers]
        time.sleep(0.05)
    go.touch()
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    folders = {Path(stdout.strip()) for stdout, _ in outputs}
    assert folders == {tiny_model_dir("demo", cache)}
    assert builds.read_text().split() == ["demo"]  # one built it, the other waited and used its copy
    (folder,) = folders
    # Built in another process, which has another string-hash seed: the tokenizer trainer must not depend on it.
    for name in ("model.safetensors", "tokenizer.json"):
        assert sha256(folder / name) == sha256(demo_dir / name), name
    assert AutoTokenizer.from_pretrained(folder)("count: 3 4 5")["input_ids"]
    assert folders_in(folder.parent) == [folder.name]


def folders_in(directory: Path) -> list[str]:
    """The folders in `directory` (its lock files aside)."""
    return sorted(path.name for path in directory.iterdir() if path.is_dir())


def test_unknown_tiny_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ModelNotFoundError, match=r"spec\.models\.actor\.path: unknown tiny model tiny://huge.*tiny://demo"
    ):
        resolve_model_path("tiny://huge", tmp_path, FIELD)


def test_local_folder_is_used_in_place(demo_dir: Path, tmp_path: Path) -> None:
    assert resolve_model_path(str(demo_dir), tmp_path, FIELD) == demo_dir
    assert resolve_model_path(f"file://{demo_dir}", tmp_path, FIELD) == demo_dir


def test_missing_local_folder_names_the_field_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(
        ModelNotFoundError, match=r"spec\.models\.critic\.path: model folder /no/such/model does not exist"
    ):
        resolve_model_path("/no/such/model", tmp_path, "spec.models.critic.path")


def test_folder_without_config_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"spec\.models\.actor\.path: .*weights has no config\.json"):
        resolve_model_path(str(tmp_path / "weights"), tmp_path, FIELD)


def test_model_not_found_is_a_value_error() -> None:
    assert issubclass(ModelNotFoundError, ValueError)


def test_unreachable_hub_says_to_mount_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def offline(**_: object) -> str:
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(
        ModelNotFoundError, match=r"spec\.models\.actor\.path: cannot download hf://org/model.*unreachable.*Mount"
    ):
        resolve_model_path("hf://org/model", tmp_path, FIELD)


def test_s3_without_s3fs_says_what_to_install(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401

        pytest.skip("s3fs is installed here")
    except ImportError:
        pass
    with pytest.raises(ModelNotFoundError, match=r"spec\.reward\.model\.path: reading s3://bucket/model needs s3fs"):
        resolve_model_path("s3://bucket/model", tmp_path, "spec.reward.model.path")


@pytest.fixture
def memory_s3(monkeypatch: pytest.MonkeyPatch):
    """memory:// standing in for s3://: the same fsspec calls, no credentials, no network. Emptied afterwards."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    real_url_to_fs = fsspec.core.url_to_fs
    monkeypatch.setattr(
        fsspec.core, "url_to_fs", lambda uri, **options: real_url_to_fs(uri.replace("s3://", "memory://"), **options)
    )
    yield memory
    memory.rm("/", recursive=True)


def test_object_store_model_is_copied_into_the_cache(tmp_path: Path, demo_dir: Path, memory_s3) -> None:
    for file in demo_dir.iterdir():
        memory_s3.pipe(f"/bucket/demo/{file.name}", file.read_bytes())
    folder = resolve_model_path("s3://bucket/demo", tmp_path, FIELD)
    assert folder == tmp_path / "s3" / "bucket" / "demo"
    assert sha256(folder / "model.safetensors") == sha256(demo_dir / "model.safetensors")


def test_each_tiny_model_has_its_own_cache_folder(tmp_path: Path) -> None:
    folders = [tiny_model_dir(name, tmp_path) for name in TINY_MODELS]
    assert len(set(folders)) == len(TINY_MODELS)
    assert all(folder.name.startswith(f"{name}-") for name, folder in zip(TINY_MODELS, folders, strict=True))


# ----------------------------------------------------------------------------- check_model_location
def test_checking_a_tiny_model_builds_nothing(tmp_path: Path) -> None:
    check_model_location("tiny://counter", tmp_path, FIELD)
    assert not tmp_path.joinpath("tiny").exists()
    with pytest.raises(ModelNotFoundError, match=r"spec\.models\.actor\.path: unknown tiny model tiny://huge"):
        check_model_location("tiny://huge", tmp_path, FIELD)


def test_checking_an_object_store_model_reads_only_whether_it_has_a_config(
    tmp_path: Path, demo_dir: Path, memory_s3
) -> None:
    memory_s3.pipe("/checked/demo/config.json", (demo_dir / "config.json").read_bytes())
    memory_s3.pipe("/checked/weights-only/model.safetensors", b"")
    check_model_location("s3://checked/demo", tmp_path, "spec.reward.model.path")
    assert list(tmp_path.iterdir()) == []  # nothing copied
    with pytest.raises(ModelNotFoundError, match=r"spec\.reward\.model\.path: s3://checked/weights-only holds no"):
        check_model_location("s3://checked/weights-only", tmp_path, "spec.reward.model.path")


def test_checking_a_hub_model_the_hub_does_not_serve_says_to_mount_it(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    asked: list[dict[str, object]] = []

    def offline(**request: object) -> str:
        asked.append(request)
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ModelNotFoundError, match=r"spec\.models\.critic\.path: cannot read hf://org/model/config.json"):
        check_model_location("hf://org/model", tmp_path, "spec.models.critic.path")
    assert [request["filename"] for request in asked] == ["config.json"]  # the config, never the weights


# ----------------------------------------------------------------------------- resolve_model_metadata
def test_the_driver_copies_an_object_store_models_config_and_tokenizer_not_its_weights(
    tmp_path: Path, demo_dir: Path, memory_s3
) -> None:
    for file in demo_dir.iterdir():
        memory_s3.pipe(f"/meta/demo/{file.name}", file.read_bytes())
    folder = resolve_model_metadata("s3://meta/demo", tmp_path, FIELD)
    assert "model.safetensors" not in {path.name for path in folder.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {path.name for path in folder.iterdir()}
    assert (
        AutoTokenizer.from_pretrained(folder)("count: 3 4 5")["input_ids"]
        == (AutoTokenizer.from_pretrained(demo_dir)("count: 3 4 5")["input_ids"])
    )
    assert not (tmp_path / "s3").exists()  # the full copy's folder stays for a worker to fill whole


def test_the_driver_asks_the_hub_for_a_models_config_and_tokenizer_only(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    asked: list[dict[str, object]] = []

    def snapshot(**request: object) -> str:
        asked.append(request)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    resolve_model_metadata("hf://org/model", tmp_path, FIELD)
    (request,) = asked
    assert request["allow_patterns"] and not any("safetensors" in p or "bin" in p for p in request["allow_patterns"])
    assert resolve_model_path("hf://org/model", tmp_path, FIELD) and asked[1]["allow_patterns"] is None  # workers
