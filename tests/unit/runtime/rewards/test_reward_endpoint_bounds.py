"""A reward service that never finishes answering, or never stops: the endpoint client is bounded anyway.

Real sockets on 127.0.0.1: a service that drips one byte every 0.2 s (inside any per-read timeout, so
only a wall-clock deadline ends it), in the status line or in the body, and a service that streams
2 GiB (one 1 MiB buffer sent again and again: streamed, not allocated on either side). Each call runs
in a thread that must finish within a few seconds; without the bounds it would run for minutes or
hold 2 GiB.
"""

import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kuberl.runtime.rewards.endpoint import MAX_RESPONSE_BYTES, RewardEndpointClient
from kuberl.runtime.rewards.functions import RewardResult

DRIP_EVERY_S = 0.2
TWO_GIB = 2 << 30
CHUNK = bytes(1 << 20)


class Adversary(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, behaviour: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.bytes_sent = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hung up on us: that is what the tests want


class _Handler(BaseHTTPRequestHandler):
    server: Adversary
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        getattr(self, self.server.behaviour)()

    def send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        self.server.bytes_sent += len(data)

    def drip(self, data: bytes) -> None:
        for index in range(len(data)):
            if self.server.stop.wait(DRIP_EVERY_S):
                return
            self.send(data[index : index + 1])

    def drip_body(self) -> None:
        self.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
        self.drip(b'{"scores": [' + b" " * 99986 + b"]}")

    def drip_status_line(self) -> None:
        self.drip(b"HTTP/1.1 200 OK\r\n" + b"X-Drip: 1\r\n" * 1000)

    def stream(self, headers: bytes) -> None:
        self.send(headers)
        while self.server.bytes_sent < TWO_GIB and not self.server.stop.is_set():
            self.send(CHUNK)

    def two_gib_declared(self) -> None:
        self.stream(f"HTTP/1.1 200 OK\r\nContent-Length: {TWO_GIB}\r\n\r\n".encode())

    def two_gib_until_close(self) -> None:
        self.close_connection = True
        self.stream(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")  # no length: the body ends when we close


@pytest.fixture
def adversary() -> Iterator[Callable[[str], Adversary]]:
    started: list[Adversary] = []

    def start(behaviour: str) -> Adversary:
        server = Adversary(behaviour)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop.set()
        server.shutdown()
        server.server_close()


def score_within(seconds: float, client: RewardEndpointClient) -> list[RewardResult]:
    """client.score on two samples in a thread that must end within `seconds`."""
    out: list[list[RewardResult]] = []
    call = threading.Thread(target=lambda: out.append(client.score(["p", "q"], ["a", "b"], [{}, {}])), daemon=True)
    call.start()
    call.join(seconds)
    assert out, f"the reward endpoint call was still running after {seconds} s"
    return out[0]


@pytest.mark.parametrize("behaviour", ["drip_body", "drip_status_line"])
def test_a_service_dripping_one_byte_per_read_timeout_is_cut_off_at_the_deadline(adversary, behaviour):
    service = adversary(behaviour)
    started = time.monotonic()
    results = score_within(6.0, RewardEndpointClient(service.url, timeout_s=1.0, max_retries=0))
    assert time.monotonic() - started < 3.0
    assert all("no complete answer" in r.error and "within 1 s" in r.error for r in results)
    assert 0 < service.bytes_sent < 100  # it was dripping, and the client stopped listening


@pytest.mark.parametrize("behaviour", ["two_gib_declared", "two_gib_until_close"])
def test_a_two_gib_answer_is_refused_without_holding_it(adversary, behaviour):
    service = adversary(behaviour)
    tracemalloc.start()
    try:
        results = score_within(20.0, RewardEndpointClient(service.url, timeout_s=30.0, max_retries=3))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(f"{MAX_RESPONSE_BYTES}" in r.error and "after 1 attempt" in r.error for r in results)  # not retried
    assert peak < 4 * MAX_RESPONSE_BYTES
    time.sleep(0.5)  # the server notices the closed socket at its next write
    assert service.bytes_sent < 16 * MAX_RESPONSE_BYTES  # loopback buffers hold a few MiB; 2 GiB never went out
