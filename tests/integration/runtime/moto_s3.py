"""moto's S3 server on loopback, with the AWS_* variables the operator would set from a Secret.

moto's server is a real S3-protocol HTTP server; s3fs (through fsspec) reaches it with the credentials
and endpoint in the environment of this process and of the processes it starts. Skips the calling test
where s3fs or moto is not installed.
"""

import importlib.util
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_s3(bucket: str, **extra_env: str) -> Iterator[str]:
    """A moto server with `bucket` created; yields its endpoint URL while the AWS_* variables point at it."""
    for package in ("s3fs", "moto"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed: s3:// cannot be tested here")
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "kuberl-test")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "kuberl-test-secret")
        patch.setenv("AWS_ENDPOINT_URL", endpoint)
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name, value in extra_env.items():
            patch.setenv(name, value)
        s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}).mkdir(bucket)
        try:
            yield endpoint
        finally:
            server.stop()
