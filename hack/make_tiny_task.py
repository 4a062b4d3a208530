"""Writes examples/data/tiny-task.jsonl, the demo's prompts: continue three consecutive integers.

    .venv/bin/python hack/make_tiny_task.py            # rewrites the file; the same bytes every time

Each record is {"prompt": "count: 3 4 5", "answer": "6 7 8"}, the start drawn from 0..15 so the
answers stay within 3..20: sixteen distinct prompts, each repeated, which a 1M-parameter model
can learn within the demo's 60 steps on CPU. The reward is `tiny_task` (kuberl.runtime.rewards.builtin).
"""

import json
import random
import sys
from pathlib import Path

RECORDS = 256
STARTS = range(16)
SEED = 0
OUTPUT = Path(__file__).resolve().parent.parent / "examples" / "data" / "tiny-task.jsonl"


def tiny_task_record(start: int) -> dict[str, str]:
    """{"prompt": "count: 3 4 5", "answer": "6 7 8"} for start 3."""
    return {
        "prompt": "count: " + " ".join(str(start + offset) for offset in range(3)),
        "answer": " ".join(str(start + offset) for offset in range(3, 6)),
    }


def tiny_task_records(count: int = RECORDS, seed: int = SEED) -> list[dict[str, str]]:
    """Every start equally often (count // 16 times each), in a shuffled order fixed by seed."""
    starts = [start for start in STARTS for _ in range(count // len(STARTS))]
    random.Random(seed).shuffle(starts)
    return [tiny_task_record(start) for start in starts]


def main(output: Path = OUTPUT) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record, sort_keys=True) for record in tiny_task_records()]
    output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT)
