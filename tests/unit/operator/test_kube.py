"""The operator's REST door: a request that gets no answer is an ApiUnreachable (transient), whatever urllib3 raised."""

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes.client import Configuration

from kuberl.operator.kube import ApiError, ApiUnreachable, Kube


@pytest.fixture
def hanging_up_server() -> Iterator[int]:
    """A port that accepts each connection and closes it without a word (a proxy or API server going away)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    listener.close()


def kube_at(port: int) -> Kube:
    configuration = Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    return Kube(configuration, timeout=5)


def test_a_connection_closed_without_an_answer_is_unreachable_and_transient(hanging_up_server: int):
    with pytest.raises(ApiUnreachable) as raised:  # urllib3 raises ProtocolError here, which is no OSError
        kube_at(hanging_up_server).get("/api/v1/namespaces/default")
    assert raised.value.transient and raised.value.status == 0
    assert "RemoteDisconnected" in str(raised.value) or "ProtocolError" in str(raised.value)


def test_a_refused_connection_is_unreachable_and_transient():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens on it once closed
    with pytest.raises(ApiUnreachable) as raised:
        kube_at(port).get("/api/v1/namespaces/default")
    assert raised.value.transient


@pytest.mark.parametrize(
    ("status", "transient"), [(500, True), (503, True), (429, True), (403, False), (422, False), (409, False)]
)
def test_which_answers_are_worth_retrying_as_they_are(status: int, transient: bool):
    assert ApiError(status, "x").transient is transient


def test_the_api_servers_message_is_taken_from_its_status_object():
    body = '{"kind": "Status", "message": "admission webhook \\"policy.example.com\\" denied the request"}'
    assert ApiError(403, "Forbidden", body).message == 'admission webhook "policy.example.com" denied the request'
    assert ApiError(502, "Bad Gateway", "<html>bad gateway</html>").message == "<html>bad gateway</html>"
