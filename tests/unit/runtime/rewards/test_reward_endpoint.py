"""HTTP reward endpoints, against a real http.server on 127.0.0.1 that plays a script of answers.

Every test's service answers at most a handful of requests and stops with the test; a slow answer
sleeps 1 s at most, against client timeouts of 0.2 s.
"""

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from kuberl.api.spec import RewardEndpointSpec
from kuberl.runtime.rewards.endpoint import TOKEN_ENV, RewardEndpointClient, backoff_delay, request_body
from kuberl.runtime.workers.reward_worker import RewardWorker


class Service(ThreadingHTTPServer):
    """Answers POSTs by a script: one behaviour per request, the last repeating."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, script: list[str], delay_s: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = list(script)
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []  # {"headers": ..., "items": ...}
        self.in_flight = 0
        self.most_in_flight = 0
        self.guard = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/score"

    def next_behaviour(self, headers: dict[str, str], items: list[dict[str, Any]]) -> str:
        with self.guard:
            self.requests.append({"headers": headers, "items": items})
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out closed its socket before the slow answer; that is the point


class _Handler(BaseHTTPRequestHandler):
    server: Service

    def do_POST(self) -> None:
        service = self.server
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        behaviour = service.next_behaviour(dict(self.headers), items)
        with service.guard:
            service.in_flight += 1
            service.most_in_flight = max(service.most_in_flight, service.in_flight)
        try:
            time.sleep(service.delay_s)
            if behaviour == "slow":
                time.sleep(1.0)
                behaviour = "ok"
            status, body = self._answer(behaviour, items)
        finally:
            with service.guard:
                service.in_flight -= 1
        self.send_response(status)
        if status == 302:
            self.send_header("Location", body.decode())
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @staticmethod
    def _answer(behaviour: str, items: list[dict[str, Any]]) -> tuple[int, bytes]:
        scores: list[Any] = [float(item["sample"]["index"]) for item in items]
        if behaviour == "500":
            return 500, b"overloaded"
        if behaviour == "400":
            return 400, b'{"error": "bad request"}'
        if behaviour == "garbage":
            return 200, b"<html>gateway says hi</html>"
        if behaviour == "short":
            return 200, json.dumps({"scores": scores[:-1]}).encode()
        if behaviour.startswith("redirect "):  # "redirect <url>": a 302 elsewhere
            return 302, behaviour.split(" ", 1)[1].encode()
        if behaviour == "null_first":
            scores[0] = None
        return 200, json.dumps({"scores": scores}).encode()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Service] = []

    def start(*script: str, delay_s: float = 0.0) -> Service:
        service = Service(list(script), delay_s)
        threading.Thread(target=service.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.shutdown()
        service.server_close()


def batch(n: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    return [f"prompt {i}" for i in range(n)], [f"response {i}" for i in range(n)], [{"index": i} for i in range(n)]


def client(url: str, **options: Any) -> RewardEndpointClient:
    options.setdefault("timeout_s", 2.0)
    options.setdefault("backoff_base_s", 0.01)
    return RewardEndpointClient(url, **options)


# ----------------------------------------------------------------------------- the protocol


def test_scores_come_back_one_per_sample_in_order(serve: Any) -> None:
    service = serve("ok")
    results = client(service.url).score(*batch(3))
    assert [result.score for result in results] == [0.0, 1.0, 2.0]
    assert [result.error for result in results] == [None, None, None]


def test_request_carries_prompt_response_and_sample_per_item(serve: Any) -> None:
    service = serve("ok")
    client(service.url).score(["What is 2+3?"], ["5"], [{"index": 0, "answer": "5"}])
    expected = {"prompt": "What is 2+3?", "response": "5", "sample": {"index": 0, "answer": "5"}}
    assert service.requests[0]["items"] == [expected]
    assert service.requests[0]["headers"]["Content-Type"] == "application/json"


def test_sample_values_json_cannot_carry_are_sent_as_numbers_or_text() -> None:
    body = json.loads(request_body(["p"], ["r"], [{"n": np.int64(3), "v": np.array([1, 2]), "when": object}]))
    sample = body["items"][0]["sample"]
    assert sample["n"] == 3 and sample["v"] == [1, 2] and sample["when"] == "<class 'object'>"


def test_bearer_token_from_the_environment_is_sent(serve: Any) -> None:
    service = serve("ok")
    spec = RewardEndpointSpec(url=service.url)
    RewardEndpointClient.from_spec(spec, env={TOKEN_ENV: "s3cret"}).score(*batch(1))
    assert service.requests[0]["headers"]["Authorization"] == "Bearer s3cret"


def test_a_redirect_is_not_followed_and_the_token_stays_home(serve: Any) -> None:
    elsewhere = serve("ok")
    service = serve(f"redirect {elsewhere.url}")
    results = client(service.url, token="s3cret", max_retries=3).score(*batch(2))
    assert elsewhere.requests == []  # neither the token nor the samples went to the redirect's target
    assert len(service.requests) == 1  # and it is not retried: the URL itself is wrong
    assert all(
        r.score == 0.0 and "redirects to" in (r.error or "") and elsewhere.url in (r.error or "") for r in results
    )


def test_no_authorization_header_without_a_token(serve: Any) -> None:
    service = serve("ok")
    RewardEndpointClient.from_spec(RewardEndpointSpec(url=service.url), env={}).score(*batch(1))
    assert "Authorization" not in service.requests[0]["headers"]


def test_a_null_score_fails_only_its_sample(serve: Any) -> None:
    service = serve("null_first")
    results = client(service.url).score(*batch(3))
    assert results[0].score == 0.0 and "returned score None" in (results[0].error or "")
    assert [(r.score, r.error) for r in results[1:]] == [(1.0, None), (2.0, None)]


# ----------------------------------------------------------------------------- retries and failures


def test_server_errors_are_retried_until_the_service_recovers(serve: Any) -> None:
    service = serve("500", "500", "ok")
    results = client(service.url, max_retries=3).score(*batch(2))
    assert [result.score for result in results] == [0.0, 1.0]
    assert [result.error for result in results] == [None, None]
    assert len(service.requests) == 3


def test_retries_wait_with_exponential_backoff(serve: Any) -> None:
    service = serve("500")
    waits: list[float] = []
    client(service.url, max_retries=3, backoff_base_s=0.5, sleep=waits.append).score(*batch(1))
    assert waits == [0.5, 1.0, 2.0]  # before retries 1, 2, 3: 0.5 * 2^0, 0.5 * 2^1, 0.5 * 2^2


def test_samples_fail_not_the_job_when_retries_run_out(serve: Any) -> None:
    service = serve("500")
    results = client(service.url, max_retries=2).score(*batch(2))
    assert len(service.requests) == 3  # the first try and 2 retries
    assert [result.score for result in results] == [0.0, 0.0]
    for result in results:
        assert result.error is not None
        assert "after 3 attempt(s)" in result.error and "HTTP 500" in result.error and "overloaded" in result.error


def test_a_slow_service_times_out(serve: Any) -> None:
    service = serve("slow")
    started = time.monotonic()
    results = client(service.url, timeout_s=0.2, max_retries=1).score(*batch(2))
    assert time.monotonic() - started < 1.5  # two 0.2 s timeouts and a 0.01 s backoff, not two 1 s answers
    assert len(service.requests) == 2
    assert all("within 0.2 s (reward.endpoint.timeoutSeconds)" in (r.error or "") for r in results)


def test_a_slow_answer_then_a_fast_one_succeeds(serve: Any) -> None:
    service = serve("slow", "ok")
    results = client(service.url, timeout_s=0.2, max_retries=1).score(*batch(2))
    assert [result.score for result in results] == [0.0, 1.0]
    assert [result.error for result in results] == [None, None]


def test_a_body_that_is_not_json_fails_the_samples(serve: Any) -> None:
    service = serve("garbage")
    results = client(service.url, max_retries=1).score(*batch(2))
    assert len(service.requests) == 2
    assert all("not JSON" in (r.error or "") and "gateway says hi" in (r.error or "") for r in results)


def test_the_wrong_number_of_scores_fails_the_samples(serve: Any) -> None:
    service = serve("short")
    results = client(service.url, max_retries=0).score(*batch(3))
    assert all("returned 2 scores for 3 items" in (r.error or "") for r in results)
    assert [r.score for r in results] == [0.0, 0.0, 0.0]


def test_client_errors_are_not_retried(serve: Any) -> None:
    service = serve("400")
    results = client(service.url, max_retries=3).score(*batch(1))
    assert len(service.requests) == 1
    assert "HTTP 400" in (results[0].error or "")


def test_an_unreachable_service_fails_the_samples(serve: Any) -> None:
    closed = serve("ok")
    url = closed.url
    closed.shutdown()
    closed.server_close()
    results = client(url, max_retries=1).score(*batch(1))
    assert "cannot reach" in (results[0].error or "")


@pytest.mark.parametrize(
    ("retry", "expected"),
    [(0, 0.5), (1, 1.0), (2, 2.0), (5, 16.0), (6, 30.0), (12, 30.0)],  # 0.5 * 2^retry, capped at 30 s
)
def test_backoff_doubles_and_is_capped(retry: int, expected: float) -> None:
    assert backoff_delay(retry, base_s=0.5, cap_s=30.0) == expected


# ----------------------------------------------------------------------------- concurrency and the worker


def test_requests_in_flight_never_exceed_max_concurrency(serve: Any) -> None:
    service = serve("ok", delay_s=0.1)
    endpoint = client(service.url, max_concurrency=2)
    results = endpoint.score_chunked(*batch(16), batch_size=2)
    assert [result.score for result in results] == [float(i) for i in range(16)]
    assert len(service.requests) == 8
    assert service.most_in_flight == 2


def test_concurrency_limit_holds_across_threads_of_one_worker(serve: Any) -> None:
    service = serve("ok", delay_s=0.1)
    endpoint = client(service.url, max_concurrency=2)
    threads = [threading.Thread(target=endpoint.score_chunked, args=(*batch(6), 2)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(service.requests) == 9
    assert service.most_in_flight == 2


def test_reward_worker_scores_through_the_endpoint_in_batch_size_requests(serve: Any) -> None:
    service = serve("ok")
    worker = RewardWorker()
    worker.setup({"endpoint": {"url": service.url, "maxConcurrency": 2}, "batchSize": 4})
    results = worker.score(*batch(10))
    assert [result.score for result in results] == [float(i) for i in range(10)]
    assert sorted(len(request["items"]) for request in service.requests) == [2, 4, 4]
