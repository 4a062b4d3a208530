"""Options for reading and writing object stores (s3://, gs://) with fsspec: checkpoints, data and models.

Credentials come as environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optional
AWS_ENDPOINT_URL for MinIO, Ceph, moto...), which the operator sets from checkpoint.secretRef and
spec.secretRefs. AWS_ENDPOINT_URL is passed to s3fs explicitly: botocore before 1.31 does not read it,
and none does with AWS_IGNORE_CONFIGURED_ENDPOINT_URLS set, and then requests would go to AWS itself.
"""

import os
from collections.abc import Mapping
from typing import Any

import fsspec


def is_remote(uri: str) -> bool:
    """True for an object-store URI (s3://, gs://, memory://...), False for a path or file://."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    return scheme not in ("", "file", "local")


def storage_options(uri: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """fsspec options for `uri`: for s3:// the endpoint from AWS_ENDPOINT_URL; listings never cached.

    >>> storage_options("s3://b/p", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    {'use_listings_cache': False, 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000'}}
    >>> storage_options("/mnt/claim/ckpt", {})
    {}
    """
    env = os.environ if env is None else env
    if not is_remote(uri):
        return {}
    # Other processes (the ranks) write under the same prefix: a cached listing would miss their files.
    options: dict[str, Any] = {"use_listings_cache": False}
    if uri.startswith(("s3://", "s3a://")) and env.get("AWS_ENDPOINT_URL"):
        options["client_kwargs"] = {"endpoint_url": env["AWS_ENDPOINT_URL"]}
    return options


def url_to_fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem for `uri`, with `storage_options`, and the path inside it."""
    return fsspec.core.url_to_fs(uri, **storage_options(uri))
