"""s3:// training data and models come from the endpoint in AWS_ENDPOINT_URL (MinIO, Ceph, moto...).

botocore 1.31 and later read AWS_ENDPOINT_URL themselves, older ones do not, and none does with
AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true, which these tests set to stand for them: without kuberl passing
the endpoint on, the requests go to AWS itself (unreachable here) instead of moto's server on loopback.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberl.runtime.data import read_records
from kuberl.runtime.models.resolve import resolve_model_path
from kuberl.runtime.models.tiny import build_tiny_model
from tests.integration.runtime.moto_s3 import moto_s3

pytestmark = pytest.mark.integration

BUCKET = "kuberl-sources"


@pytest.fixture(scope="module")
def s3_bucket() -> Iterator[str]:
    with moto_s3(BUCKET, AWS_IGNORE_CONFIGURED_ENDPOINT_URLS="true", AWS_MAX_ATTEMPTS="1"):
        yield f"s3://{BUCKET}"


def s3fs_with_endpoint():
    import os

    import s3fs

    return s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})


def test_training_data_on_s3_is_read_from_the_configured_endpoint(s3_bucket: str):
    records = [{"prompt": f"count: {i}", "answer": str(i + 1)} for i in range(3)]
    s3fs_with_endpoint().pipe(f"{BUCKET}/data/train.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
    found = read_records(f"{s3_bucket}/data/train.jsonl", "spec.data.train", Path("/nonexistent"))
    assert [record.data for record in found] == records


def test_a_model_on_s3_is_downloaded_from_the_configured_endpoint(s3_bucket: str, tmp_path: Path):
    build_tiny_model("demo", tmp_path / "built")
    s3fs_with_endpoint().put(str(tmp_path / "built") + "/", f"{BUCKET}/models/demo/", recursive=True)
    folder = resolve_model_path(f"{s3_bucket}/models/demo", tmp_path / "cache", "spec.models.actor.path")
    assert folder == tmp_path / "cache" / "s3" / BUCKET / "models" / "demo"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (tmp_path / "built").iterdir())
