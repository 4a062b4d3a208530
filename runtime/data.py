"""Prompts: read from jsonl/parquet, rendered, tokenized once at start, and batched as a pure function of the step.

Everything that can be wrong with the data — a missing file, a bad JSON line, a record without
the prompt field, a prompt over maxPromptLength — surfaces in `PromptDataset.load`, before any
model is loaded, with the file, the line or record and the spec field in the message.

A split is one location or a list of them (verl's train_files / val_files), read in the order
given. Records are kept whole: kuberl's `{prompt, answer}` and verl's preprocessed layout
(`prompt` as chat messages, `data_source`, `reward_model.ground_truth`, `extra_info`) reach the
reward as they are in the file. `data.overlongPrompt: drop` leaves over-long prompts out, as
verl's filter_overlong_prompts does, and counts them (`PromptDataset.dropped_overlong`).

`PromptLoader.batch(step)` holds no iterator state: the batch of a step is computed from
(seed, step) alone — epoch = step // steps_per_epoch, and that epoch's order is a permutation
drawn from a torch.Generator seeded with (seed, epoch). A job resumed at step k therefore sees
exactly the prompts an uninterrupted run would, with nothing about the loader in the checkpoint.
"""

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from kuberl.api import DataSpec
from kuberl.api.enums import OverlongPrompt

SUFFIXES = (".jsonl", ".parquet")
log = logging.getLogger(__name__)


class DataError(ValueError):
    """Prompt data that cannot be used; the message names the file, the record and the spec field, and what to do."""


@dataclass(frozen=True)
class Prompt:
    index: int  # position in the dataset
    input_ids: list[int]  # (L,) the prompt's tokens, L <= data.maxPromptLength
    text: str  # the rendered prompt (chat template applied), decoded from input_ids when truncated
    record: dict[str, Any]  # the raw record (answer etc.), handed to reward functions


@dataclass(frozen=True)
class SourceRecord:
    where: str  # "train.jsonl line 3" / "part-0.parquet row 2": for error messages
    data: Any


class PromptDataset:
    """The tokenized prompts of one split; `dropped_overlong` counts the records data.overlongPrompt: drop left out."""

    def __init__(self, prompts: list[Prompt], dropped_overlong: int = 0) -> None:
        self.prompts = prompts
        self.dropped_overlong = dropped_overlong

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> Prompt:
        return self.prompts[i]

    @classmethod
    def load(
        cls, spec: DataSpec, tokenizer: Any, base_dir: Path, split: str = "train", tools: Sequence[dict[str, Any]] = ()
    ) -> "PromptDataset":
        """Reads, renders and tokenizes the split; relative paths are read from base_dir (the manifest's folder).

        `tools` (function schemas, an environment's) are rendered into chat-template prompts.
        """
        if split not in ("train", "validation"):
            raise ValueError(f"split {split!r}; use 'train' or 'validation'")
        field = f"spec.data.{split}"
        locations = spec.locations(split)
        if not locations:
            raise DataError(f"{field} is not set; give a .jsonl or .parquet file or a directory of them")
        records: list[SourceRecord] = []
        for number, location in enumerate(locations):
            where = field if len(locations) == 1 else f"{field}[{number}]"
            records.extend(read_records(location, where, base_dir))
        if not records:
            shown = locations[0] if len(locations) == 1 else ", ".join(locations)
            raise DataError(f"{field}: {shown} holds no records; add prompts, one JSON object per line")
        texts = [render_prompt(record, i, spec, tokenizer, field, tools) for i, record in enumerate(records)]
        # A chat template writes its own special tokens; a plain prompt gets the tokenizer's (a BOS, if any).
        encoded = tokenizer(texts, add_special_tokens=not spec.chat_template)["input_ids"]
        prompts: list[Prompt] = []
        dropped = 0
        for i, (record, text, ids) in enumerate(zip(records, texts, encoded, strict=True)):
            if spec.overlong_prompt == OverlongPrompt.DROP and len(ids) > spec.max_prompt_length:
                dropped += 1
                continue
            kept = _fit_length(list(ids), i, record.where, spec, field, encoded)
            shown = text if len(kept) == len(ids) else tokenizer.decode(kept)
            prompts.append(Prompt(index=len(prompts), input_ids=kept, text=shown, record=record.data))
        if dropped:
            log.info(
                "%s: dropped %d of %d prompts over spec.data.maxPromptLength %d (spec.data.overlongPrompt: drop)",
                field,
                dropped,
                len(records),
                spec.max_prompt_length,
            )
        if not prompts:
            raise DataError(
                f"{field}: all {len(records)} prompts are over spec.data.maxPromptLength {spec.max_prompt_length} and "
                "spec.data.overlongPrompt: drop left none; raise spec.data.maxPromptLength"
            )
        return cls(prompts, dropped)


def _fit_length(
    ids: list[int], index: int, where: str, spec: DataSpec, field: str, all_ids: list[list[int]]
) -> list[int]:
    limit = spec.max_prompt_length
    if len(ids) <= limit:
        return ids
    if spec.overlong_prompt == OverlongPrompt.TRUNCATE_LEFT:
        return ids[-limit:]
    if spec.overlong_prompt == OverlongPrompt.TRUNCATE_RIGHT:
        return ids[:limit]
    others = sum(1 for other in all_ids if len(other) > limit) - 1
    more = f" ({others} more records are too long)" if others else ""
    raise DataError(
        f"{field}: record {index} ({where}) has {len(ids)} prompt tokens, over spec.data.maxPromptLength {limit}"
        f"{more}; raise spec.data.maxPromptLength, or set spec.data.overlongPrompt to truncate_left or truncate_right"
    )


def render_prompt(
    record: SourceRecord, index: int, spec: DataSpec, tokenizer: Any, field: str, tools: Sequence[dict[str, Any]] = ()
) -> str:
    """The prompt text of a record: the prompt field as is, or rendered with the chat template (and `tools`)."""
    data = record.data
    if spec.prompt_field not in data:
        raise DataError(
            f"{field}: record {index} ({record.where}) has no field {spec.prompt_field!r} (spec.data.promptField); "
            f"its fields are: {', '.join(sorted(data)) or 'none'}. Set spec.data.promptField to the field holding the "
            "prompt"
        )
    prompt = data[spec.prompt_field]
    if isinstance(prompt, str) and not spec.chat_template:
        return prompt
    if isinstance(prompt, list) and not spec.chat_template:
        raise DataError(
            f"{field}: record {index} ({record.where}) holds a list of chat messages in {spec.prompt_field!r}; "
            "set spec.data.chatTemplate: true to render them with the tokenizer's chat template"
        )
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not all(_is_message(message) for message in prompt):
        raise DataError(
            f"{field}: record {index} ({record.where}) field {spec.prompt_field!r} is {type(prompt).__name__}; "
            'a prompt is a string or a list of {"role": ..., "content": "..."} messages'
        )
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "spec.data.chatTemplate is true but the tokenizer has no chat template; "
            "set spec.data.chatTemplate: false, or use a model whose tokenizer_config.json has one"
        )
    extra = {"tools": list(tools)} if tools else {}
    rendered: str = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **extra)
    return rendered


def _is_message(message: Any) -> bool:
    return isinstance(message, dict) and all(isinstance(message.get(key), str) for key in ("role", "content"))


# ----------------------------------------------------------------------------- reading


def read_records(location: str, field: str, base_dir: Path) -> list[SourceRecord]:
    """The records at a location: a file, or a directory of .jsonl/.parquet files read in name order."""
    if "://" in location and not location.startswith("file://"):
        return _read_remote(location, field)
    path = Path(location.removeprefix("file://"))
    if not path.is_absolute():
        path = base_dir / path
    if not path.exists():
        raise DataError(
            f"{field}: {path} does not exist; check the path (relative paths are read from the manifest's folder) "
            "or mount the volume that holds it"
        )
    files = _data_files(sorted(p for p in path.iterdir() if p.is_file()), path, field) if path.is_dir() else [path]
    _check_suffix(files[0].name, field)
    records: list[SourceRecord] = []
    for file in files:
        with file.open("rb") as stream:
            records.extend(_parse(stream, file.name, field))
    return records


def _read_remote(uri: str, field: str) -> list[SourceRecord]:
    scheme = uri.split("://", 1)[0]
    try:
        from kuberl.runtime.objectstore import url_to_fs

        filesystem, root = url_to_fs(uri)
    except ImportError as error:
        package = {"s3": "s3fs", "gs": "gcsfs"}.get(scheme, "fsspec")
        raise DataError(
            f"{field}: reading {uri} needs {package}, which is not installed; install it in the runtime image, "
            "or copy the data to a volume and give its path"
        ) from error
    except ValueError as error:
        raise DataError(f"{field}: {uri}: {error}; use a path, file://, s3:// or gs://") from error
    try:
        if filesystem.isdir(root):
            names = sorted(name for name in filesystem.ls(root, detail=False) if filesystem.isfile(name))
            files = _data_files(names, uri, field)
        elif filesystem.exists(root):
            files = [root]
        else:
            raise DataError(f"{field}: {uri} does not exist; check the URI and its credentials (spec.secretRefs)")
        _check_suffix(str(files[0]), field)
        records: list[SourceRecord] = []
        for name in files:
            with filesystem.open(name, "rb") as stream:
                records.extend(_parse(stream, str(name).rsplit("/", 1)[-1], field))
        return records
    except DataError:
        raise
    except Exception as error:  # credentials, network, permissions
        raise DataError(
            f"{field}: cannot read {uri} ({type(error).__name__}: {error}); check the URI and that "
            "spec.secretRefs give credentials for it"
        ) from error


def _data_files(names: list[Any], folder: object, field: str) -> list[Any]:
    """The .jsonl/.parquet files among a directory's entries (Paths, or names on an object store)."""
    files = [name for name in names if str(name).endswith(SUFFIXES)]
    if not files:
        raise DataError(f"{field}: directory {folder} has no .jsonl or .parquet files")
    return files


def _check_suffix(name: str, field: str) -> None:
    if not name.endswith(SUFFIXES):
        raise DataError(f"{field}: {name} is neither .jsonl nor .parquet; convert it to one of them")


def _parse(stream: Any, name: str, field: str) -> Iterator[SourceRecord]:
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(stream).to_pylist()
        except Exception as error:  # pyarrow raises its own ArrowInvalid etc.
            raise DataError(f"{field}: {name} is not a readable parquet file ({error})") from error
        yield from (SourceRecord(f"{name} row {row}", data) for row, data in enumerate(rows))
        return
    for number, raw in enumerate(stream, start=1):
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{field}: {name} line {number} is not valid JSON ({error.msg} at column {error.colno}); "
                "each line must be one JSON object"
            ) from error
        if not isinstance(data, dict):
            raise DataError(f"{field}: {name} line {number} is a JSON {type(data).__name__}, not an object")
        yield SourceRecord(f"{name} line {number}", data)


# ----------------------------------------------------------------------------- batching


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for one epoch's order, from (seed, epoch) and nothing else."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{epoch}".encode()).digest()[:8], "big") >> 1


class PromptLoader:
    """Batches of prompts by step. `batch(step)` is a pure function of (seed, step): resuming needs no state."""

    def __init__(
        self,
        dataset: PromptDataset,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        epochs: int,
        total_steps: int | None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epochs = epochs
        # The incomplete last batch is dropped: every step trains on exactly batch_size prompts.
        self.steps_per_epoch = len(dataset) // batch_size
        if self.steps_per_epoch == 0:
            raise DataError(
                f"{len(dataset)} prompts, fewer than spec.data.batchSize {batch_size}; add prompts or lower "
                "spec.data.batchSize"
            )
        self.total_steps = total_steps if total_steps is not None else epochs * self.steps_per_epoch
        self._order = lru_cache(maxsize=2)(self._epoch_order)

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def batch(self, step: int) -> tuple[int, list[Prompt]]:
        """(epoch, prompts) of a step. Steps past the last epoch start new epochs (new orders) as usual."""
        if step < 0:
            raise ValueError(f"step {step}; steps count from 0")
        epoch, position = divmod(step, self.steps_per_epoch)
        order = self._order(epoch)
        indices = order[position * self.batch_size : (position + 1) * self.batch_size]
        return epoch, [self.dataset[i] for i in indices]
