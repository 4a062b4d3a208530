"""A gsm8k-style task a tiny model can learn, in verl's data layout, and a tiny model that can read it.

The questions are gsm8k-shaped (a chat message; the answer after `#### `, scored by verl's gsm8k scorer
through `reward.function: by_data_source`) but easy: "What comes after 41 42 43?" -> `#### 44`. A random
1M-parameter model never writes `#### 44` on its own, so, as real RL starts from an instruct model, the
model is first taught the answer format by a short supervised pass (`format_model`): it sees each
question answered `#### N` with the right N only `RIGHT_SHARE` of the time and a random number below
100 otherwise. It starts RL writing the format and right about a third of the time; what RL has to
teach is to prefer the right number, which is what a rising reward shows.
"""

import hashlib
import random
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.runtime.models.tiny import BUILDER_VERSION, build_tiny_model

DATA_SOURCE = "openai/gsm8k"
#: How often the supervised pass shows the right answer; the rest are another of the task's answers.
RIGHT_SHARE = 0.3
#: The counts start below this: ten questions, ten answers (3..12), few enough to learn in a short test.
STARTS = 10


def question(start: int) -> str:
    return f"What comes after {start} {start + 1} {start + 2}?"


def verl_row(start: int, split: str, index: int, filler: int = 0) -> dict:
    """One record as verl's examples/data_preprocess/gsm8k.py lays it out; `filler` words make it over-long."""
    text = question(start) + (" Think about it." * filler)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": text}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(start + 3)},
        "extra_info": {"split": split, "index": index},
    }


def write_split(path: Path, starts: list[int], split: str, overlong_every: int = 0) -> int:
    """Writes a parquet file of the questions at `starts`; every `overlong_every`-th is over-long. Returns how many."""
    rows = [
        verl_row(start, split, index, filler=30 if overlong_every and index % overlong_every == 0 else 0)
        for index, start in enumerate(starts)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return sum(1 for index in range(len(starts)) if overlong_every and index % overlong_every == 0)


def format_model(cache: Path, steps: int = 100, batch_size: int = 32, seed: int = 0) -> Path:
    """tiny://demo taught the `#### N` answer format on the task's questions (right RIGHT_SHARE of the time).

    Built once (~50 s on a busy 2-core machine) into `cache`, under a name that changes with anything that
    changes the build, and committed by a rename, so later runs and parallel ones reuse a complete folder.
    """
    key = hashlib.sha256(f"{BUILDER_VERSION}|{RIGHT_SHARE}|{STARTS}|{steps}|{batch_size}|{seed}".encode()).hexdigest()
    directory = cache / f"gsm8k-style-{key[:12]}"
    if (directory / "config.json").exists():
        return directory
    building = Path(tempfile.mkdtemp(prefix="gsm8k-style-", dir=cache))
    _train_format(building, steps, batch_size, seed)
    try:
        building.rename(directory)
    except OSError:  # another run committed the same build first
        shutil.rmtree(building, ignore_errors=True)
    return directory


def _train_format(directory: Path, steps: int, batch_size: int, seed: int) -> None:
    build_tiny_model("demo", directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine two threads wait on each other
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            texts = []
            for _ in range(batch_size):
                start = rng.randrange(0, STARTS)
                answer = start + 3 if rng.random() < RIGHT_SHARE else rng.randrange(0, STARTS) + 3
                messages = [{"role": "user", "content": question(start)}]
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                texts.append(f"{prompt}#### {answer}")
            rows = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in texts]
            width = max(len(row) for row in rows)
            ids = torch.full((len(rows), width), tokenizer.eos_token_id)  # (B, L)
            labels = torch.full((len(rows), width), -100)  # (B, L)
            for row, tokens in enumerate(rows):
                ids[row, : len(tokens)] = torch.tensor(tokens)
                labels[row, : len(tokens)] = torch.tensor(tokens)
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(directory)
