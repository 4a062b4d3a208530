"""The webhook's serving certificate is renewed in place: a new pair in the mounted files is served without a
restart, so a long-running operator never outlives its certificate (cert-manager renews before expiry; Helm's
pair lasts webhook.certValidityDays, tests/unit/chart)."""

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

from kuberl.operator import webhook
from kuberl.operator.settings import OperatorSettings
from tests.integration.certs import write_certificate
from tests.integration.envtest import free_port
from tests.unit.operator.conftest import KUBERAY

pytestmark = pytest.mark.integration


async def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only looking at what is served
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(der)


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(webhook, "CERTIFICATE_CHECK_SECONDS", 0.1)
    first_cert, key, first = write_certificate(tmp_path / "tls", ["127.0.0.1"])
    port = free_port()
    server = webhook.server(
        OperatorSettings(
            webhook_port=port,
            webhook_addr="127.0.0.1",
            webhook_cert=str(first_cert),
            webhook_key=str(key),
            kuberay=KUBERAY,
        )
    )

    async def review(*_: Any, **__: Any) -> dict[str, Any]:
        return {}

    async def scenario() -> tuple[bytes, bytes]:
        serving = asyncio.create_task(serve_forever(server, review))
        try:
            before = await wait_served(port, lambda der: True)
            write_certificate(tmp_path / "tls", ["127.0.0.1"])  # what the kubelet does when the Secret is renewed
            after = await wait_served(port, lambda der: der != before)
            return before, after
        finally:
            serving.cancel()

    before, after = asyncio.run(scenario())
    assert before == ssl.PEM_cert_to_DER_cert(first.decode())
    assert after == ssl.PEM_cert_to_DER_cert((tmp_path / "tls" / "tls.crt").read_text())


async def serve_forever(server: Any, fn: Any) -> None:
    async for _ in server(fn):  # kopf yields the client config, then waits for the files to change
        pass


async def wait_served(port: int, accept: Any, timeout: float = 10.0) -> bytes:
    deadline = asyncio.get_running_loop().time() + timeout
    last: Exception | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            der = await served_certificate(port)
        except OSError as error:  # between listeners while kopf restarts the site
            last = error
        else:
            if accept(der):
                return der
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no acceptable certificate on port {port} within {timeout} s (last error: {last})")
