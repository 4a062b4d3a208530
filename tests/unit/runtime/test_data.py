"""Prompt data: reading jsonl/parquet, errors that name file, record and field, rendering, truncation, batching."""

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kuberl.api import DataSpec
from kuberl.runtime.data import DataError, Prompt, PromptDataset, PromptLoader, read_records
from kuberl.runtime.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def counting(starts: range) -> list[dict[str, str]]:
    return [{"prompt": f"count: {a} {a + 1} {a + 2}", "answer": f"{a + 3} {a + 4} {a + 5}"} for a in starts]


def load(tmp_path: Path, tokenizer, **spec: Any) -> PromptDataset:
    spec.setdefault("train", "train.jsonl")
    return PromptDataset.load(DataSpec(**spec), tokenizer, tmp_path)


def loader(size: int, batch_size: int, **options: Any) -> PromptLoader:
    dataset = PromptDataset([Prompt(i, [i], str(i), {}) for i in range(size)])
    settings: dict[str, Any] = {"shuffle": True, "seed": 0, "epochs": 1, "total_steps": None} | options
    return PromptLoader(dataset, batch_size, **settings)


# ----------------------------------------------------------------------------- reading


def test_jsonl_records_become_tokenized_prompts(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", counting(range(3)))
    dataset = load(tmp_path, tokenizer)
    assert len(dataset) == 3
    prompt = dataset[1]
    assert prompt.index == 1
    assert prompt.text == "count: 1 2 3"
    assert prompt.input_ids == tokenizer("count: 1 2 3")["input_ids"]
    assert prompt.record == {"prompt": "count: 1 2 3", "answer": "4 5 6"}  # the whole record, for the reward


def test_blank_lines_are_skipped(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    assert [p.text for p in load(tmp_path, tokenizer)] == ["a", "b"]


def test_parquet_records_become_prompts(tmp_path: Path, tokenizer) -> None:
    pq.write_table(pa.Table.from_pylist(counting(range(4))), tmp_path / "train.parquet")
    dataset = load(tmp_path, tokenizer, train="train.parquet")
    assert [p.text for p in dataset] == [f"count: {a} {a + 1} {a + 2}" for a in range(4)]
    assert dataset[3].record["answer"] == "6 7 8"


def test_a_directory_is_read_file_by_file_in_name_order(tmp_path: Path, tokenizer) -> None:
    folder = tmp_path / "prompts"
    folder.mkdir()
    write_jsonl(folder / "b.jsonl", counting(range(2, 4)))
    pq.write_table(pa.Table.from_pylist(counting(range(0, 2))), folder / "a.parquet")
    write_jsonl(folder / "c.jsonl", counting(range(4, 5)))
    (folder / "README.md").write_text("not data")
    dataset = load(tmp_path, tokenizer, train="prompts")
    assert [p.record["prompt"].split()[1] for p in dataset] == ["0", "1", "2", "3", "4"]
    assert [p.index for p in dataset] == [0, 1, 2, 3, 4]


def test_relative_paths_are_read_from_the_base_dir_and_file_uris_work(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", counting(range(2)))
    absolute = PromptDataset.load(DataSpec(train=f"file://{tmp_path / 'train.jsonl'}"), tokenizer, Path("/"))
    assert [p.text for p in absolute] == [p.text for p in load(tmp_path, tokenizer)]


def test_object_store_uris_are_read_with_fsspec(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    memory.pipe("/bucket/prompts/part-1.jsonl", b'{"prompt": "second"}\n')
    memory.pipe("/bucket/prompts/part-0.jsonl", b'{"prompt": "first"}\n')
    try:
        records = read_records("memory://bucket/prompts", "spec.data.train", tmp_path)
        assert [r.data["prompt"] for r in records] == ["first", "second"]
        assert records[1].where == "part-1.jsonl line 1"
    finally:
        memory.rm("/bucket", recursive=True)


def test_s3_without_s3fs_says_what_to_install(tmp_path: Path, tokenizer) -> None:
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401

        pytest.skip("s3fs is installed here")
    except ImportError:
        pass
    with pytest.raises(DataError, match=r"spec\.data\.train: reading s3://bucket/train\.jsonl needs s3fs"):
        load(tmp_path, tokenizer, train="s3://bucket/train.jsonl")


# ----------------------------------------------------------------------------- errors


def test_missing_file_names_the_field_and_the_path(tmp_path: Path, tokenizer) -> None:
    with pytest.raises(DataError, match=rf"^spec\.data\.train: {tmp_path}/nope\.jsonl does not exist"):
        load(tmp_path, tokenizer, train="nope.jsonl")


def test_missing_validation_file_names_data_validation(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", counting(range(2)))
    spec = DataSpec(train="train.jsonl", validation="val.jsonl")
    with pytest.raises(DataError, match=r"^spec\.data\.validation: .*val\.jsonl does not exist"):
        PromptDataset.load(spec, tokenizer, tmp_path, split="validation")


def test_unset_validation_split_is_an_error(tmp_path: Path, tokenizer) -> None:
    with pytest.raises(DataError, match=r"spec\.data\.validation is not set"):
        PromptDataset.load(DataSpec(train="train.jsonl"), tokenizer, tmp_path, split="validation")


def test_empty_file_is_an_error(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "train.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"spec\.data\.train: train\.jsonl holds no records"):
        load(tmp_path, tokenizer)


def test_directory_without_data_files_is_an_error(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"spec\.data\.train: directory .*prompts has no \.jsonl or \.parquet files"):
        load(tmp_path, tokenizer, train="prompts")


def test_unsupported_file_type_is_an_error(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "train.csv").write_text("prompt\nhi\n")
    with pytest.raises(DataError, match=r"spec\.data\.train: train\.csv is neither \.jsonl nor \.parquet"):
        load(tmp_path, tokenizer, train="train.csv")


def test_bad_json_line_names_the_file_and_line(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": oops}\n')
    with pytest.raises(DataError, match=r"^spec\.data\.train: train\.jsonl line 3 is not valid JSON"):
        load(tmp_path, tokenizer)


def test_a_line_that_is_not_an_object_names_the_line(tmp_path: Path, tokenizer) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a"}\n["prompt", "b"]\n')
    with pytest.raises(DataError, match=r"train\.jsonl line 2 is a JSON list, not an object"):
        load(tmp_path, tokenizer)


def test_record_without_the_prompt_field_names_the_record_field_and_its_keys(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}])
    with pytest.raises(DataError) as raised:
        load(tmp_path, tokenizer)
    message = str(raised.value)
    assert "record 0 (train.jsonl line 1)" in message
    assert "'prompt' (spec.data.promptField)" in message
    assert "its fields are: answer, question" in message


def test_prompt_field_can_be_renamed(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"question": "a b", "answer": "1"}])
    assert load(tmp_path, tokenizer, prompt_field="question")[0].text == "a b"


def test_a_prompt_that_is_neither_text_nor_messages_is_an_error(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a"}, {"prompt": 7}])
    with pytest.raises(DataError, match=r"record 1 \(train\.jsonl line 2\) field 'prompt' is int"):
        load(tmp_path, tokenizer)


# ----------------------------------------------------------------------------- chat template


MESSAGES = [{"role": "system", "content": "Count."}, {"role": "user", "content": "count: 1 2 3"}]


def test_chat_messages_are_rendered_with_the_template_and_a_generation_prompt(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": MESSAGES}])
    prompt = load(tmp_path, tokenizer, chat_template=True)[0]
    assert prompt.text == (
        "<|im_start|>system\nCount.<|im_end|>\n<|im_start|>user\ncount: 1 2 3<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.input_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(prompt.input_ids) == prompt.text


def test_a_string_prompt_with_the_chat_template_becomes_a_user_message(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "hi"}])
    prompt = load(tmp_path, tokenizer, chat_template=True)[0]
    assert prompt.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_messages_without_chat_template_say_to_turn_it_on(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": MESSAGES}])
    with pytest.raises(DataError, match=r"record 0 .*set spec\.data\.chatTemplate: true"):
        load(tmp_path, tokenizer)


def test_malformed_chat_messages_are_an_error(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": [{"role": "user"}]}])
    with pytest.raises(DataError, match=r"record 0 .*a list of \{\"role\""):
        load(tmp_path, tokenizer, chat_template=True)


def test_chat_template_on_a_tokenizer_without_one_is_an_error(tmp_path: Path) -> None:
    bare = build_tiny_tokenizer()
    bare.chat_template = None
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "hi"}])
    with pytest.raises(DataError, match=r"tokenizer has no chat template; set spec\.data\.chatTemplate: false"):
        load(tmp_path, bare, chat_template=True)


# ----------------------------------------------------------------------------- max prompt length


LONG = "count: 1 2 3 4 5 6 7 8 9"  # "count", ":", " 1" .. " 9": 11 tokens


def test_overlong_prompt_is_an_error_naming_record_tokens_and_limit(tmp_path: Path, tokenizer) -> None:
    assert len(tokenizer(LONG)["input_ids"]) == 11
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "count: 1"}, {"prompt": LONG}, {"prompt": LONG}])
    message = r"record 1 \(train\.jsonl line 2\) has 11 prompt tokens, over spec\.data\.maxPromptLength 4 \(1 more"
    with pytest.raises(DataError, match=message):
        load(tmp_path, tokenizer, max_prompt_length=4)


def test_truncate_left_keeps_the_last_tokens(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": LONG}])
    prompt = load(tmp_path, tokenizer, max_prompt_length=4, overlong_prompt="truncate_left")[0]
    assert prompt.input_ids == tokenizer(LONG)["input_ids"][-4:]
    assert prompt.text == " 6 7 8 9"


def test_truncate_right_keeps_the_first_tokens(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": LONG}])
    prompt = load(tmp_path, tokenizer, max_prompt_length=4, overlong_prompt="truncate_right")[0]
    assert prompt.input_ids == tokenizer(LONG)["input_ids"][:4]
    assert prompt.text == "count: 1 2"


def test_prompt_at_the_limit_is_kept_whole(tmp_path: Path, tokenizer) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": LONG}])
    assert load(tmp_path, tokenizer, max_prompt_length=11)[0].text == LONG


def test_the_demo_data_loads_within_its_manifests_limit(tokenizer) -> None:
    examples = Path(__file__).resolve().parents[3] / "examples"
    dataset = PromptDataset.load(DataSpec(train="data/tiny-task.jsonl", max_prompt_length=32), tokenizer, examples)
    assert len(dataset) == 256
    assert max(len(p.input_ids) for p in dataset) == 5  # "count", ":", " a", " a+1", " a+2"


# ----------------------------------------------------------------------------- PromptLoader


def test_steps_per_epoch_drops_the_incomplete_last_batch() -> None:
    assert loader(10, 3).steps_per_epoch == 3  # 10 // 3; the 10th prompt waits for the next epoch's order


def test_total_steps_defaults_to_epochs_times_steps_per_epoch() -> None:
    assert loader(10, 3, epochs=4).total_steps == 12
    assert loader(10, 3, epochs=4, total_steps=50).total_steps == 50


def test_fewer_prompts_than_the_batch_size_is_an_error() -> None:
    with pytest.raises(DataError, match=r"^5 prompts, fewer than spec\.data\.batchSize 8"):
        loader(5, 8)


def test_each_epoch_is_a_permutation_covering_every_prompt_once() -> None:
    prompts = loader(12, 4, epochs=3)
    for epoch in range(3):
        indices = [p.index for step in range(3 * epoch, 3 * epoch + 3) for p in prompts.batch(step)[1]]
        assert sorted(indices) == list(range(12)), epoch


def test_epochs_are_shuffled_differently() -> None:
    prompts = loader(12, 4, epochs=2)
    first = [p.index for step in range(3) for p in prompts.batch(step)[1]]
    second = [p.index for step in range(3, 6) for p in prompts.batch(step)[1]]
    assert first != second
    assert first != list(range(12))


def test_batches_are_a_pure_function_of_seed_and_step() -> None:
    # A resumed job builds a fresh loader and asks for step k directly: it must get what a long run got.
    long_run = loader(20, 4, epochs=3)
    expected = {step: long_run.batch(step) for step in range(15)}
    resumed = loader(20, 4, epochs=3)
    for step in [11, 3, 14, 0, 7]:
        assert resumed.batch(step) == expected[step]


def test_the_seed_changes_the_order() -> None:
    assert loader(20, 4, seed=0).batch(0) != loader(20, 4, seed=1).batch(0)


def test_batch_reports_the_epoch() -> None:
    prompts = loader(8, 4)
    assert [prompts.batch(step)[0] for step in range(5)] == [0, 0, 1, 1, 2]


def test_steps_past_the_last_epoch_start_new_epochs() -> None:
    prompts = loader(8, 4, epochs=1, total_steps=6)
    epoch, batch = prompts.batch(5)
    assert epoch == 2 and len(batch) == 4
    assert sorted(p.index for step in (4, 5) for p in prompts.batch(step)[1]) == list(range(8))


def test_without_shuffle_prompts_come_in_file_order() -> None:
    prompts = loader(8, 4, shuffle=False)
    assert [p.index for p in prompts.batch(1)[1]] == [4, 5, 6, 7]
    assert [p.index for p in prompts.batch(2)[1]] == [0, 1, 2, 3]


def test_negative_step_is_refused() -> None:
    with pytest.raises(ValueError, match="step -1"):
        loader(8, 4).batch(-1)
