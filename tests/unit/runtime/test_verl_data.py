"""verl's preprocessed data layout, lists of data files, over-long prompts dropped (filter_overlong_prompts)."""

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kuberl.api import DataSpec, parse_rljob
from kuberl.api.crd import build_crd
from kuberl.api.manifest import ManifestError
from kuberl.runtime.data import DataError, PromptDataset
from kuberl.runtime.models.tiny import build_tiny_tokenizer
from tests.integration.runtime.jobs import demo_job


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def verl_row(index: int, question: str, answer: str, source: str = "openai/gsm8k") -> dict:
    """One row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index, "question": question},
    }


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.name


def test_a_verl_parquet_file_loads_whole_with_its_chat_prompt_rendered(tmp_path: Path, tokenizer) -> None:
    rows = [verl_row(i, f"what is {i} + 1?", str(i + 1)) for i in range(3)]
    name = write_parquet(tmp_path / "train.parquet", rows)
    dataset = PromptDataset.load(DataSpec(train=name, chat_template=True), tokenizer, tmp_path)
    assert [prompt.record for prompt in dataset] == rows  # data_source, reward_model, extra_info travel along
    assert dataset[2].text == "<|im_start|>user\nwhat is 2 + 1?<|im_end|>\n<|im_start|>assistant\n"


def test_jsonl_with_verls_fields_loads_the_same_as_parquet(tmp_path: Path, tokenizer) -> None:
    rows = [verl_row(i, f"what is {i} + 1?", str(i + 1)) for i in range(3)]
    write_parquet(tmp_path / "a.parquet", rows)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    from_parquet = PromptDataset.load(DataSpec(train="a.parquet", chat_template=True), tokenizer, tmp_path)
    from_jsonl = PromptDataset.load(DataSpec(train="a.jsonl", chat_template=True), tokenizer, tmp_path)
    assert [(p.record, p.input_ids) for p in from_jsonl] == [(p.record, p.input_ids) for p in from_parquet]


def test_a_list_of_files_is_read_in_the_order_given(tmp_path: Path, tokenizer) -> None:
    second = write_parquet(tmp_path / "b.parquet", [verl_row(0, "b0", "1"), verl_row(1, "b1", "2")])
    first = write_parquet(tmp_path / "a.parquet", [verl_row(0, "a0", "3")])
    (tmp_path / "more").mkdir()
    write_parquet(tmp_path / "more" / "c.parquet", [verl_row(0, "c0", "4")])
    spec = DataSpec(train=[second, first, "more"], chat_template=True)
    dataset = PromptDataset.load(spec, tokenizer, tmp_path)
    assert [p.record["extra_info"]["question"] for p in dataset] == ["b0", "b1", "a0", "c0"]
    assert [p.index for p in dataset] == [0, 1, 2, 3]


def test_a_missing_file_in_a_list_names_its_position(tmp_path: Path, tokenizer) -> None:
    write_parquet(tmp_path / "a.parquet", [verl_row(0, "a", "1")])
    spec = DataSpec(train="a.parquet", validation=["a.parquet", "gone.parquet"], chat_template=True)
    with pytest.raises(DataError, match=r"^spec\.data\.validation\[1\]: .*gone\.parquet does not exist"):
        PromptDataset.load(spec, tokenizer, tmp_path, split="validation")


def test_drop_leaves_over_long_prompts_out_and_counts_them(tmp_path: Path, tokenizer, caplog) -> None:
    rows = [verl_row(i, "count " * (2 if i % 3 else 30), str(i)) for i in range(9)]  # rows 0, 3, 6 are long
    name = write_parquet(tmp_path / "train.parquet", rows)
    spec = DataSpec(train=name, chat_template=True, max_prompt_length=20, overlong_prompt="drop")
    with caplog.at_level(logging.INFO, logger="kuberl.runtime.data"):
        dataset = PromptDataset.load(spec, tokenizer, tmp_path)
    assert [p.record["extra_info"]["index"] for p in dataset] == [1, 2, 4, 5, 7, 8]
    assert dataset.dropped_overlong == 3 and [p.index for p in dataset] == list(range(6))
    assert "spec.data.train: dropped 3 of 9 prompts over spec.data.maxPromptLength 20" in caplog.text
    # without drop the same file stops the job at start
    with pytest.raises(DataError, match="over spec.data.maxPromptLength 20"):
        PromptDataset.load(spec.model_copy(update={"overlong_prompt": "error"}), tokenizer, tmp_path)


def test_drop_that_leaves_nothing_is_an_error(tmp_path: Path, tokenizer) -> None:
    name = write_parquet(tmp_path / "train.parquet", [verl_row(0, "count " * 30, "1")])
    spec = DataSpec(train=name, chat_template=True, max_prompt_length=5, overlong_prompt="drop")
    with pytest.raises(DataError, match=r"^spec\.data\.train: all 1 prompts are over spec\.data\.maxPromptLength 5"):
        PromptDataset.load(spec, tokenizer, tmp_path)


def test_the_schema_takes_one_location_or_a_list() -> None:
    assert DataSpec(train="a.parquet").locations("train") == ["a.parquet"]
    assert DataSpec(train=["a.parquet", "b/"], validation=["v.parquet"]).locations("validation") == ["v.parquet"]
    assert DataSpec(train="a.parquet").locations("validation") == []
    with pytest.raises(ValueError, match="give at least one file"):
        DataSpec(train=[])
    with pytest.raises(ValueError, match="unsupported scheme ftp://"):
        DataSpec(train=["a.parquet", "ftp://x/y"])


def test_a_manifest_with_verls_key_names_hears_the_kuberl_ones() -> None:
    manifest = demo_job().to_manifest()
    manifest["spec"]["data"]["filterOverlongPrompts"] = True
    with pytest.raises(ManifestError, match=r"spec\.data\.filterOverlongPrompts: unknown field \(did you mean "
                       r"overlongPrompt: drop\?\)"):  # fmt: skip
        parse_rljob(manifest)


def test_the_crd_lets_a_data_location_be_a_string_or_a_list() -> None:
    data = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["data"]
    for name in ("train", "validation"):
        node = data["properties"][name]
        assert node["x-kubernetes-preserve-unknown-fields"] is True and "type" not in node
    assert data["properties"]["overlongPrompt"]["enum"] == ["error", "truncate_left", "truncate_right", "drop"]
