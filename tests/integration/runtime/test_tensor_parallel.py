"""Tensor-parallel rollout (rollout.tensorParallelSize: 2) with the real vLLM CPU engine, split over two
worker processes by vLLM's mp executor, against the same engine unsplit.

Greedy decoding is deterministic, so a split engine must pick the same tokens as one that is not, and
score them the same (fp32, up to the order of a sum over shards). The weights a sync loads are the
counting model's, perturbed: a split engine that kept its old weights in one shard would answer
differently from the unsplit one after the sync, or not change its answers at all.
"""

import time
from pathlib import Path

import pytest
import torch

from kuberl.runtime.driver import run_job
from kuberl.runtime.engines.base import SamplingParams
from kuberl.runtime.engines.vllm import is_listening, socket_folder
from kuberl.runtime.models.resolve import ModelLocation, default_cache_dir, resolve_model_path
from kuberl.runtime.workers.rollout_worker import RolloutWorker, weight_buckets
from tests.integration.runtime.jobs import demo_base_dir, demo_job
from tests.integration.runtime.test_vllm_engine import hf_model, manifest, perturbed

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOLERANCE = 1e-4
TEXTS = ["count: 3 4 5", "count: 17 18 19", "numbers: 40 41 42", "count: 88"]


@pytest.fixture(scope="module")
def counter_dir() -> Path:
    """tiny://counter (4 attention heads, 2 key-value heads): it counts, so greedy answers vary by prompt."""
    return resolve_model_path("tiny://counter", default_cache_dir(), "tiny://counter")


def separate_rollout_manifest(model_dir: Path, tensor_parallel: int) -> dict:
    """test_vllm_engine's greedy engine, as a replica of a separate rollout pool split `tensor_parallel` ways."""
    job = manifest(model_dir, 0.0, placement="separate", tensorParallelSize=tensor_parallel)
    job["spec"]["resources"] = {"rollout": {"replicas": 1, "cpus": 2}}  # a core per shard
    return job


def shared_memory_segments() -> set[str]:
    """Python's shared-memory segments (vLLM's shm_broadcast queues among them), named semaphores
    (multiprocessing's locks: vLLM's executor shares one with its shard processes) and the segments of vLLM's
    CPU communicator (a colocated engine split over ranks) on this machine."""
    patterns = ("psm_*", "sem.mp-*", "*cpushm*")
    return {path.name for pattern in patterns for path in Path("/dev/shm").glob(pattern)}


def mapped_by_a_process(segment: str) -> bool:
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if f"/dev/shm/{segment}" in maps.read_text():
                return True
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return False


def leaked_segments(before: set[str], wait_s: float = 10.0) -> set[str]:
    """Segments made since `before` that outlived every process that mapped them. The segments are watched
    until all are gone, or for `wait_s`: one still mapped may be on its way out with its process (a killed
    actor's), and another process on the machine (this machine is shared) may have one whose owner has just
    ended and whose resource tracker is about to remove it."""
    deadline = time.monotonic() + wait_s
    while (made := shared_memory_segments() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {segment for segment in made if not mapped_by_a_process(segment)}


def temporary_entries() -> set[Path]:
    return set(socket_folder().parent.iterdir())


def socket_leftovers(before: set[Path], wait_s: float = 10.0) -> set[Path]:
    """What engines left in the temporary folder since `before` (its entries then): socket files nobody listens on
    (vLLM's default place for its IPC sockets), and socket folders of processes that are gone. Watched for up to
    `wait_s` while any is left, as the segments are (`leaked_segments`)."""
    deadline = time.monotonic() + wait_s
    while (left := stale_entries(before)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def stale_entries(before: set[Path]) -> set[Path]:
    made = temporary_entries() - before
    stale_sockets = {path for path in made if path.is_socket() and not is_listening(path)}
    abandoned = {path for path in made if path.name.startswith("kuberl-vllm-")}
    return stale_sockets | {
        path for path in abandoned if not Path(f"/proc/{path.name.removeprefix('kuberl-vllm-')}").exists()
    }


def attention_heads_per_shard(worker: RolloutWorker) -> list[int]:
    """The query heads of the first attention layer in each of the engine's worker processes."""
    return worker.engine.llm.collective_rpc(_first_layer_heads)


def _first_layer_heads(vllm_worker) -> int:
    model = getattr(vllm_worker, "worker", vllm_worker).model_runner.get_model()
    return int(model.model.layers[0].self_attn.num_heads)


def greedy(worker: RolloutWorker, prompts: list[list[int]], version: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each prompt's greedy response and its tokens' log-probs, from the weights of `version`."""
    generations = worker.generate(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=8), version)
    return [g[0].token_ids for g in generations], [g[0].logprobs for g in generations]


def test_a_two_way_split_engine_decodes_greedily_as_one_does_before_and_after_a_weight_sync(counter_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(counter_dir)
    prompts = [tokenizer(text)["input_ids"] for text in TEXTS]
    new_weights = perturbed(hf_model(counter_dir), seed=5)
    state = {name: tensor.detach().clone() for name, tensor in new_weights.state_dict().items()}
    buckets = list(weight_buckets(state.items(), 64 << 10))  # several buckets, as the actor sends them
    assert len(buckets) > 1
    results, heads = {}, {}
    for shards in (1, 2):  # one engine at a time: this machine has two cores
        worker = RolloutWorker()
        model = ModelLocation(str(counter_dir), "spec.models.actor.path")  # a folder: resolved in place
        worker.setup(separate_rollout_manifest(counter_dir, shards), model, model, threads=2)
        try:
            if shards == 2:  # the queues between the engine and its shard processes bind their sockets here
                assert any(path.is_socket() for path in socket_folder().iterdir())
            heads[shards] = attention_heads_per_shard(worker)
            before = greedy(worker, prompts, version=0)
            worker.load_weights_from(buckets, version=1)
            results[shards] = before, greedy(worker, prompts, version=1)
        finally:
            worker.shutdown()
        assert not socket_folder().exists()  # the sockets went with the engine, not left in the temporary folder
    assert heads == {1: [4], 2: [2, 2]}  # the split engine really holds half the heads in each process
    for when in (0, 1):
        (one_tokens, one_logprobs), (two_tokens, two_logprobs) = results[1][when], results[2][when]
        assert two_tokens == one_tokens
        for one, two in zip(one_logprobs, two_logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(two), torch.tensor(one), atol=TOLERANCE, rtol=0)
    assert results[2][1][0] != results[2][0][0]  # the sync changed what the split engine answers


def test_a_separate_grpo_job_with_a_two_way_split_engine_trains_and_its_engine_matches_the_trainer(
    ray_session, tmp_path
):
    job = demo_job(
        **{
            "rollout.engine": "vllm",
            "rollout.placement": "separate",
            "rollout.tensorParallelSize": 2,
            "rollout.verifySync": True,
            "rollout.verifySyncTolerance": TOLERANCE,
            "resources.rollout": {"replicas": 1, "cpus": 2},
            "training.totalSteps": 2,
            "checkpoint.exportHf": False,
        }
    )
    before, entries_before = shared_memory_segments(), temporary_entries()
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    assert [record["step"] for record in run.history] == [1, 2]
    for record in run.history:
        assert record["sync/max_logprob_diff"] <= TOLERANCE  # the probe after each sync, in the split engine
        assert record["rollout/logprob_diff_max"] <= TOLERANCE  # every sampled token against the trainer
    # the split engine's queues (a few hundred MB of /dev/shm) went with the job: the replica was stopped,
    # not only killed; and its sockets with it
    assert not leaked_segments(before)
    assert not socket_leftovers(entries_before)


# -- colocated: the engine split over the trainer's ranks (vLLM's external launcher) --------------------------
def colocated_manifest(model_dir: Path, tensor_parallel: int) -> dict:
    """test_vllm_engine's greedy engine, colocated in the actor's ranks and split over `tensor_parallel` of them."""
    job = manifest(model_dir, 0.0, placement="colocated", tensorParallelSize=tensor_parallel)
    job["spec"]["resources"] = {"actor": {"replicas": 2, "cpus": 1}}
    return job


def colocated_rank(rank: int, world: int, model_dir: str, rendezvous: str, out: str) -> None:
    """One trainer rank holding its shard of a colocated engine split `world` ways: greedy answers, a sync of the
    full perturbed weights (what each rank gathers from FSDP), greedy answers again, and its shard's heads."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from kuberl.api import parse_rljob
    from kuberl.runtime.engines.vllm import VLLMRolloutEngine

    torch.set_num_threads(1)
    if world > 1:  # the trainer's process group, which the shards join
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    spec = parse_rljob(colocated_manifest(Path(model_dir), world)).spec
    engine = VLLMRolloutEngine.create(spec, model_dir, torch.device("cpu"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        prompts = [tokenizer(text)["input_ids"] for text in TEXTS]
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)

        def answers() -> tuple[list[list[int]], list[list[float]]]:
            generations = engine.generate(prompts, params)
            return [g[0].token_ids for g in generations], [g[0].logprobs for g in generations]

        before = answers()
        engine.load_weights(
            (name, p.detach()) for name, p in perturbed(hf_model(Path(model_dir)), seed=5).named_parameters()
        )
        after = answers()
        heads = engine.llm.collective_rpc(_first_layer_heads)  # in this process: this rank's shard only
        torch.save({"before": before, "after": after, "heads": heads}, Path(out) / f"{world}-{rank}.pt")
    finally:
        engine.shutdown()  # vLLM's teardown destroys the default process group too
    assert not socket_folder().exists()  # this rank's process lives on (the pool's), its engine's sockets do not
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_colocated_engine_split_over_two_ranks_decodes_greedily_as_one_does_before_and_after_a_sync(
    rank_pool, counter_dir: Path, tmp_path: Path
):
    for world in (1, 2):  # one engine at a time: this machine has two cores
        rank_pool.run(
            colocated_rank, world, world, str(counter_dir), str(tmp_path / f"rendezvous-{world}"), str(tmp_path)
        )
    one, *two = [torch.load(tmp_path / name) for name in ("1-0.pt", "2-0.pt", "2-1.pt")]
    assert one["heads"] == [4] and [rank["heads"] for rank in two] == [[2], [2]]  # each rank holds half the heads
    for rank in two:  # the ranks of a group generate together and answer alike, as the unsplit engine does
        for when in ("before", "after"):
            (one_tokens, one_logprobs), (tokens, logprobs) = one[when], rank[when]
            assert tokens == one_tokens
            for expected, got in zip(one_logprobs, logprobs, strict=True):
                torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=TOLERANCE, rtol=0)
    assert one["after"][0] != one["before"][0]  # the sync changed what the engines answer


@pytest.mark.parametrize(
    ("steps", "lora"),
    [(2, None), (1, {"rank": 4, "alpha": 8})],  # a LoRA actor's adapters load into each rank's shard
    ids=["full-weights", "lora-adapter"],
)
def test_a_colocated_grpo_job_with_an_engine_split_over_its_two_ranks_trains_and_matches_the_trainer(
    ray_session, tmp_path, steps, lora
):
    job = demo_job(
        **{
            "rollout.engine": "vllm",
            "rollout.tensorParallelSize": 2,
            "rollout.verifySync": True,
            "rollout.verifySyncTolerance": TOLERANCE,
            "training.totalSteps": steps,
            "checkpoint.exportHf": False,
            **({"models.actor.lora": lora} if lora else {}),
        }
    )
    assert job.spec.resources.actor.world_size == 2 and job.spec.rollout.placement == "colocated"
    before, entries_before = shared_memory_segments(), temporary_entries()
    run = run_job(job, tmp_path, demo_base_dir(), progress=False)
    assert [record["step"] for record in run.history] == list(range(1, steps + 1))
    for record in run.history:
        assert record["sync/max_logprob_diff"] <= TOLERANCE  # the probe after each sync, in the split engine
        assert record["rollout/logprob_diff_max"] <= TOLERANCE  # every sampled token against the trainer
    # the split engine's communicator segments went with the job (vLLM leaves them until its process exits, and
    # the workers are stopped, then killed)
    assert not leaked_segments(before)
    assert not socket_leftovers(entries_before)
