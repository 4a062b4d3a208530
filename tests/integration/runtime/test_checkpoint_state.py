"""Resume is exact: a 2-rank FSDP2 trainer saves after one step, fresh trainers load, and the next step matches.

The run that never stopped takes steps 1 and 2 on 2 ranks (gloo, CPU, fp32) and saves after
step 1. Fresh trainers, built from *different* random weights so that only the checkpoint can
make them agree, load that checkpoint on 2, 1 and 3 ranks and take step 2. The run saves into
a local folder (committed by rename) and into an object store (`nonatomic://`, committed by
its marker; moto's S3 in test_checkpoint_s3.py). Step 2 draws its
batch from the global torch RNG and also draws from python's and numpy's, so a resume that
lost the RNG, the Adam moments or the LR schedule (warm-up: the LR changes every step) would
differ. With the same world size everything is bit-identical; with another one the summation
order of the gradients changes, so weights agree to 1e-6.
"""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

from kuberl.api.spec import OptimizerSpec
from kuberl.runtime.checkpoint import CheckpointRef, CheckpointStore, export_hf, load_trainer_state, save_trainer_state
from kuberl.runtime.engines.fsdp import FSDPTrainer, global_sum
from tests.integration.runtime.rank_pool import RankPool

pytestmark = pytest.mark.integration

VOCAB, ROWS, WIDTH = 64, 6, 8  # 6 rows split evenly over 1, 2 and 3 ranks
OPTIM = OptimizerSpec(lr=1e-2, warmup_steps=3, schedule="cosine", grad_clip=1.0, weight_decay=0.1)


class NonAtomicFileSystem(DirFileSystem):
    """Local files behind the fsspec interface, under a scheme the checkpoint code treats as an object store."""

    protocol = "nonatomic"

    def __init__(self, **options: object) -> None:
        super().__init__(path="/", fs=LocalFileSystem(), **options)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return "/" + str(path).removeprefix("nonatomic://").lstrip("/")


# Here, at import, so that the ranks' processes (which import this module for their function) know it too.
# test_checkpoint_s3.py runs the object-store round trip through it.
fsspec.register_implementation("nonatomic", NonAtomicFileSystem, clobber=True)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config).float()


def train_step(trainer: Any, rank: int, world: int) -> dict[str, Any]:
    """One update on a batch drawn from the global RNG; this rank trains on rows rank::world."""
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH))  # (6, 8) the same on every rank: same RNG state
    mine = ids[rank::world]  # (6/world, 8)
    logits = trainer.model(input_ids=mine).logits[:, :-1].float()  # (6/world, 7, V)
    # Summed over this rank's tokens, divided by all tokens: the ranks' gradients sum to the batch mean's.
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1), reduction="sum")
    loss = loss / (ROWS * (WIDTH - 1))
    loss.backward()
    stats = trainer.optimizer_step()
    return {"loss": global_sum(loss.detach()), "lr": stats["lr"], "draws": (random.random(), float(np.random.rand()))}


def full_weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in trainer.full_tensors()}


def start(rank: int, world: int, rendezvous: str, seed: int) -> FSDPTrainer:
    import torch.distributed as dist

    # A file rendezvous, not a TCP port: a port picked free in the parent can be taken by the time ranks bind it.
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    trainer = FSDPTrainer(tiny_model(seed), world_size=world, device=torch.device("cpu"), optim=OPTIM, total_steps=10)
    random.seed(seed)
    np.random.seed(seed)
    return trainer


def uninterrupted_rank(rank: int, world: int, rendezvous: str, locations: list[str], out: str) -> None:
    """Steps 1 and 2, saving after step 1 in between (the saves must not disturb the run either)."""
    import torch.distributed as dist

    trainer = start(rank, world, rendezvous, seed=0)
    train_step(trainer, rank, world)
    after_first = full_weights(trainer)
    for location in locations:
        save_trainer_state(trainer, location, "actor", rank)
    second = train_step(trainer, rank, world)
    after_second = full_weights(trainer)
    if rank == 0:
        torch.save({"after_first": after_first, "after_second": after_second, **second}, out)
    dist.destroy_process_group()


def resumed_rank(rank: int, world: int, rendezvous: str, location: str, out: str) -> None:
    """A fresh trainer from other random weights and RNG seeds loads the checkpoint, then takes step 2."""
    import torch.distributed as dist

    trainer = start(rank, world, rendezvous, seed=1)
    load_trainer_state(trainer, location, "actor", rank)
    loaded = full_weights(trainer)
    second = train_step(trainer, rank, world)
    after_second = full_weights(trainer)
    if rank == 0:
        torch.save({"loaded": loaded, "after_second": after_second, **second}, out)
    dist.destroy_process_group()


def rendezvous_file(out: Path) -> str:
    """A fresh file for the ranks' rendezvous (it must not exist), beside their results."""
    return str(out.with_suffix(".rendezvous"))


def save_uninterrupted_run(ranks: RankPool, stores: list[CheckpointStore], out: Path) -> list[CheckpointRef]:
    """The driver's part around the ranks' save, into each store: begin, the ranks write, commit."""
    locations = [store.begin(1) for store in stores]
    ranks.run(uninterrupted_rank, 2, 2, rendezvous_file(out), locations, str(out))
    job = {"kind": "RLJob", "metadata": {"name": "resume"}}
    return [store.commit(location, 1, {"epoch": 0}, job) for store, location in zip(stores, locations, strict=True)]


def resume(ranks: RankPool, ref: CheckpointRef, world: int, out: Path) -> dict[str, Any]:
    ranks.run(resumed_rank, world, world, rendezvous_file(out), ref.uri, str(out))
    return torch.load(out)


def assert_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], exact: bool) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        if exact:
            assert torch.equal(actual[name], expected[name]), name
        else:
            torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=1e-6, msg=name)


@dataclass
class Saved:
    local: CheckpointRef  # on a local folder: the rename commit
    object_store: CheckpointRef  # on nonatomic://: the marker commit
    uninterrupted: dict[str, Any]  # the 2-rank run that never stopped


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, rank_pool: RankPool) -> Saved:
    folder = tmp_path_factory.mktemp("checkpoint")
    stores = [CheckpointStore(str(folder / "local"), 2), CheckpointStore(f"nonatomic://{folder}/object-store", 2)]
    local, object_store = save_uninterrupted_run(rank_pool, stores, folder / "uninterrupted.pt")
    return Saved(local, object_store, torch.load(folder / "uninterrupted.pt"))


def assert_resumed_like_uninterrupted(resumed: dict[str, Any], uninterrupted: dict[str, Any], exact: bool) -> None:
    assert_weights(resumed["loaded"], uninterrupted["after_first"], exact=True)  # loading itself is exact
    assert resumed["lr"] == uninterrupted["lr"]  # the schedule went on from step 1
    assert resumed["draws"] == uninterrupted["draws"]  # python's and numpy's RNG too
    if exact:
        assert resumed["loss"] == uninterrupted["loss"]
    else:
        assert resumed["loss"] == pytest.approx(uninterrupted["loss"], rel=0, abs=1e-6)
    assert_weights(resumed["after_second"], uninterrupted["after_second"], exact=exact)


def test_two_rank_checkpoint_is_committed_and_found(saved: Saved):
    store = CheckpointStore(str(Path(saved.local.uri).parent), keep_last=2)
    assert store.latest() == saved.local
    files = sorted(path.name for path in (Path(saved.local.uri) / "actor").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]


def test_object_store_checkpoint_is_committed_in_place_by_its_marker(saved: Saved):
    root = saved.object_store.uri.rsplit("/", 1)[0]
    assert saved.object_store.uri == f"{root}/step-000001"  # written there directly: no rename
    assert CheckpointStore(root, keep_last=2).latest() == saved.object_store


def test_resume_on_the_same_world_size_is_bit_identical(saved: Saved, tmp_path: Path, rank_pool: RankPool):
    resumed = resume(rank_pool, saved.local, 2, tmp_path / "resumed.pt")
    assert_resumed_like_uninterrupted(resumed, saved.uninterrupted, exact=True)


def test_resume_on_one_rank_from_an_object_store_matches_the_two_rank_run(
    saved: Saved, tmp_path: Path, rank_pool: RankPool
):
    resumed = resume(rank_pool, saved.object_store, 1, tmp_path / "resumed.pt")
    assert_resumed_like_uninterrupted(resumed, saved.uninterrupted, exact=False)


def test_resume_on_three_ranks_matches_the_two_rank_run(saved: Saved, tmp_path: Path, rank_pool: RankPool):
    resumed = resume(rank_pool, saved.local, 3, tmp_path / "resumed.pt")  # uneven shards: 16 rows -> 6, 6, 4
    assert_resumed_like_uninterrupted(resumed, saved.uninterrupted, exact=False)


@pytest.mark.parametrize("where", ["local", "object_store"])
def test_export_writes_a_hugging_face_folder_with_the_checkpointed_weights(saved: Saved, where: str, tmp_path: Path):
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    base = tmp_path / "base"
    tiny_model(seed=2).save_pretrained(base)  # other weights: only the checkpoint's may come out
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0").save_pretrained(base)

    out = export_hf(getattr(saved, where).uri, str(base), str(tmp_path / "model"))

    exported = {name: p.detach() for name, p in AutoModelForCausalLM.from_pretrained(out).named_parameters()}
    assert_weights(exported, saved.uninterrupted["after_first"], exact=True)
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("t5") == 5
