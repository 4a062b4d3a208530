"""Benchmark checkpoint save and load against plain sequential I/O of the same bytes on the same disk.

    .venv/bin/python bench/checkpoint.py [--dir /tmp] [--layers 12]

Builds a ~100M-parameter Qwen2 (fp32) as an FSDP2 trainer on one process (gloo, CPU), takes one
AdamW step so the optimizer state exists (weights + 2 moments: ~1.2 GB), then times:

1. save: CheckpointStore.begin -> save_trainer_state (DCP shards, fsync'd) -> commit (hashes,
   marker, rename, latest pointer);
2. load: load_trainer_state into the same trainer (DCP read + set_state_dict + scheduler/RNG);
3. plain write: the same number of bytes to one file in 64 MiB chunks, then fsync;
4. plain read: that file back in 64 MiB chunks.

Each round saves a new step (keepLast 1 deletes the one before, as in a run); the table shows
the median of --repeat rounds. Before each read the files are dropped from the page cache
(posix_fadvise DONTNEED, which needs no privileges and drops only clean pages: everything was
fsync'd), so reads come from the disk as far as the kernel lets them (a VM's host may still
cache them). Prints a table with GB/s and the ratio to plain I/O.
"""

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/checkpoint.py` puts bench/ first
    sys.path.append(str(REPO))

from kuberl.api.spec import OptimizerSpec  # noqa: E402
from kuberl.runtime.checkpoint import CheckpointStore, load_trainer_state, save_trainer_state  # noqa: E402
from kuberl.runtime.engines.fsdp import FSDPTrainer  # noqa: E402

CHUNK = 64 << 20


def build_trainer(layers: int) -> FSDPTrainer:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=True,
        max_position_embeddings=512,
    )
    model = Qwen2ForCausalLM(config).float()
    trainer = FSDPTrainer(model, world_size=1, device=torch.device("cpu"), optim=OptimizerSpec(lr=1e-4), total_steps=10)
    ids = torch.randint(0, config.vocab_size, (1, 16))  # (1, 16)
    trainer.model(input_ids=ids, labels=ids).loss.backward()
    trainer.optimizer_step()
    return trainer


def drop_from_page_cache(folder: Path) -> None:
    for path in [folder] if folder.is_file() else folder.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def plain_write(path: Path, size: int) -> float:
    chunk = os.urandom(1 << 20) * (CHUNK >> 20)  # incompressible, reused: generating 1 GB would dominate
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as stream:
        left = size
        while left > 0:
            left -= stream.write(memoryview(chunk)[: min(CHUNK, left)])
        os.fsync(stream.fileno())
    return time.perf_counter() - started


def plain_read(path: Path) -> float:
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as stream:
        while stream.readinto(buffer):
            pass
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write (the disk under test)")
    parser.add_argument("--layers", type=int, default=12, help="decoder layers (12: ~100M parameters)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the table shows each figure's median")
    args = parser.parse_args()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    work = Path(tempfile.mkdtemp(prefix="kuberl-bench-checkpoint-", dir=args.dir))
    try:
        trainer = build_trainer(args.layers)
        parameters = sum(p.numel() for p in trainer.model.parameters())

        store = CheckpointStore(str(work / "checkpoints"), keep_last=1)
        timings: dict[str, list[float]] = {"save": [], "load": [], "write": [], "read": []}
        for step in range(1, args.repeat + 1):
            started = time.perf_counter()
            location = store.begin(step)
            save_trainer_state(trainer, location, "actor", rank=0)
            ref = store.commit(location, step, {"epoch": 0}, {"kind": "RLJob"})
            timings["save"].append(time.perf_counter() - started)
            size = sum(path.stat().st_size for path in Path(ref.uri).rglob("*") if path.is_file())

            drop_from_page_cache(Path(ref.uri))
            started = time.perf_counter()
            load_trainer_state(trainer, ref.uri, "actor", rank=0)
            timings["load"].append(time.perf_counter() - started)

            plain = work / "plain.bin"
            timings["write"].append(plain_write(plain, size))
            drop_from_page_cache(plain)
            timings["read"].append(plain_read(plain))
            plain.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        dist.destroy_process_group()

    gigabytes = size / 1e9
    median = {name: statistics.median(values) for name, values in timings.items()}
    print(f"model: Qwen2 {parameters / 1e6:.1f}M parameters fp32 + AdamW state; checkpoint {gigabytes:.2f} GB")
    print(f"disk: {args.dir}; {os.cpu_count()} CPUs; torch {torch.__version__}; median of {args.repeat} rounds")
    print(f"{'operation':<34}{'seconds':>9}{'GB/s':>8}{'vs plain':>10}")
    rows = [
        ("save (DCP + commit)", median["save"], median["write"]),
        ("plain write + fsync", median["write"], median["write"]),
        ("load (DCP + set_state_dict)", median["load"], median["read"]),
        ("plain read", median["read"], median["read"]),
    ]
    for name, seconds, baseline in rows:
        print(f"{name:<34}{seconds:>9.2f}{gigabytes / seconds:>8.2f}{baseline / seconds:>10.2f}")


if __name__ == "__main__":
    main()
