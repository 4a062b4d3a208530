"""Checkpoints on S3: 2 ranks save through s3fs to moto's server, 1 rank resumes, the marker is the commit.

moto's server (moto_s3.py) is a real S3-protocol HTTP server on loopback; s3fs (through fsspec) and DCP's
FsspecWriter/FsspecReader reach it with the credentials and endpoint in the AWS_* variables the
operator sets from checkpoint.secretRef. Skipped where s3fs or moto is not installed; the
object-store commit itself (marker, no rename, fsspec readers and writers) is also tested on
every machine through `nonatomic://` in test_checkpoint_state.py.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kuberl.runtime.checkpoint import CheckpointStore
from kuberl.runtime.checkpoint.storage import Location
from kuberl.runtime.checkpoint.store import LATEST
from tests.integration.runtime.moto_s3 import moto_s3
from tests.integration.runtime.rank_pool import RankPool
from tests.integration.runtime.test_checkpoint_state import (
    assert_resumed_like_uninterrupted,
    resume,
    save_uninterrupted_run,
)

pytestmark = pytest.mark.integration

BUCKET = "kuberl-checkpoints"


@pytest.fixture(scope="module")
def s3_uri() -> Iterator[str]:
    """A bucket on a moto server; the AWS_* variables are set for this process and go to the ranks with each job."""
    with moto_s3(BUCKET):
        yield f"s3://{BUCKET}/jobs/demo"


def test_s3_round_trip_from_two_ranks_to_one(s3_uri: str, tmp_path: Path, rank_pool: RankPool):
    store = CheckpointStore(s3_uri, keep_last=2)
    (ref,) = save_uninterrupted_run(rank_pool, [store], tmp_path / "uninterrupted.pt")
    assert ref.uri == f"{s3_uri}/step-000001"
    assert CheckpointStore(s3_uri, keep_last=2).latest() == ref
    resumed = resume(rank_pool, ref, 1, tmp_path / "resumed.pt")
    assert_resumed_like_uninterrupted(resumed, torch.load(tmp_path / "uninterrupted.pt"), exact=False)


def test_s3_checkpoint_is_committed_by_its_marker_in_place(s3_uri: str):
    store = CheckpointStore(f"{s3_uri}-layout", keep_last=2)
    location = store.begin(7)
    assert location == f"{s3_uri}-layout/step-000007"  # no temporary name: S3 cannot rename atomically
    Location(location).child("actor", ".metadata").write_bytes(b"dcp metadata")
    assert store.latest() is None
    store.commit(location, 7, {}, {"kind": "RLJob"})
    assert store.latest().step == 7
    assert store.root.child(LATEST).read_bytes() == b"step-000007\n"


def test_an_unfinished_s3_save_is_removed_by_remove_unfinished_not_by_opening(s3_uri: str):
    uri = f"{s3_uri}-crash"
    store = CheckpointStore(uri, keep_last=2)
    crashed = store.begin(3)
    Location(crashed).child("actor", "__0_0.distcp").write_bytes(b"half an upload")
    reopened = CheckpointStore(uri, keep_last=2)
    assert Location(crashed).exists()
    reopened.remove_unfinished()
    assert not Location(crashed).exists()
